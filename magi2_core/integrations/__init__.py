"""Adapters that put magi2-core's operators under other serving stacks.

:mod:`magi2_core.integrations.vllm_omni`: checkpoint-compatible MAGI-2 layers for vllm-omni and the
vLLM general plugin that routes vllm-omni's MAGI-2 operators to magi2-core.
"""
