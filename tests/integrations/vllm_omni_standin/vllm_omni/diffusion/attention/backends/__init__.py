"""Stand-in for ``vllm_omni.diffusion.attention.backends`` (vllm-omni 0.30.0)."""
