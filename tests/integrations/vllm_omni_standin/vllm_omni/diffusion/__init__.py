"""Stand-in for ``vllm_omni.diffusion`` (vllm-omni 0.30.0)."""
