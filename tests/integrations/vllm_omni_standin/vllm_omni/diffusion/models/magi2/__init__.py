"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/__init__.py`` (the pipeline
exports are left out: the plugin never touches them)."""
