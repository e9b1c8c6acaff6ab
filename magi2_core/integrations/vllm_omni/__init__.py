"""vllm-omni's MAGI-2, served by magi2-core: checkpoint-compatible layers and a vLLM plugin.

The layers keep vllm-omni 0.30.0's parameter names, shapes, dtypes and call signatures, so a MAGI-2
checkpoint loads into them without renaming:

- :class:`Magi2MultiHeadMoE` (``mh_moe.Magi2MultiHeadMoE``): head-routed MoE, expert-parallel over heads;
- :class:`MultiModalityRMSNorm` (``layers.MultiModalityRMSNorm``): flat weight, dispatcher group sizes;
- :func:`varlen_attention_with_sink` / :func:`packed_attention_with_sink`: packed attention with sinks.

:func:`register` is the ``vllm.general_plugins`` entry point that swaps them into vllm-omni
(``MAGI2_VLLM_OMNI=0`` turns it off); see ``docs/vllm-omni.md``.
"""

from magi2_core.integrations.vllm_omni.attention import packed_attention_with_sink, varlen_attention_with_sink
from magi2_core.integrations.vllm_omni.moe import EPGroup, Magi2MultiHeadMoE, Magi2MultiHeadMoEConfig
from magi2_core.integrations.vllm_omni.norm import MultiModalityRMSNorm
from magi2_core.integrations.vllm_omni.plugin import SUPPORTED_VERSIONS, register, unregister

__all__ = [
    "SUPPORTED_VERSIONS",
    "EPGroup",
    "Magi2MultiHeadMoE",
    "Magi2MultiHeadMoEConfig",
    "MultiModalityRMSNorm",
    "packed_attention_with_sink",
    "register",
    "unregister",
    "varlen_attention_with_sink",
]
