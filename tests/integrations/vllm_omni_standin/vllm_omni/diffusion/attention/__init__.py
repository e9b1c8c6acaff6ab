"""Stand-in for ``vllm_omni.diffusion.attention`` (vllm-omni 0.30.0)."""
