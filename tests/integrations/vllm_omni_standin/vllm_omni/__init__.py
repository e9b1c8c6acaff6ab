"""Stand-in for the ``vllm_omni`` package (vllm-omni 0.30.0); see ../README.md."""
