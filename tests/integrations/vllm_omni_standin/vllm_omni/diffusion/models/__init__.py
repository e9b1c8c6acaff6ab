"""Stand-in for ``vllm_omni.diffusion.models`` (vllm-omni 0.30.0)."""
