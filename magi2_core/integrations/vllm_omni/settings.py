"""The ``MAGI2_*`` variables of the vllm-omni integration, declared by the integration itself.

They are declared when the integration is imported (by vLLM's plugin loader, or by code that builds
its layers), under the owner :data:`OWNER`; ``docs/configuration.md`` lists them with that owner.
``MAGI2_VLLM_OMNI`` is read once, by the plugin when vLLM loads it, and fixed then
(:func:`magi2_core.config.fix`): a later change raises ``ConfigChangeError`` at the next call.
``MAGI2_ROUTER_BIAS_SOURCE`` is read on every forward of a MoE layer, as vllm-omni reads it
(:func:`router_bias_source`), so plugin on and off select with the same bias after any sequence of
settings.
"""

from __future__ import annotations

from magi2_core import config
from magi2_core.model.backend_spec import Setting

__all__ = [
    "OWNER",
    "PLUGIN_LOAD",
    "ROUTER_BIAS_SOURCE",
    "SETTINGS",
    "VLLM_OMNI",
    "VLLM_OMNI_MHC",
    "VLLM_OMNI_OUTPUT_GATE",
    "VLLM_OMNI_QK_ROPE",
    "VLLM_OMNI_SHARED_EXPERTS",
    "router_bias_source",
]

OWNER = "magi2-core (vllm-omni integration)"

VLLM_OMNI = Setting(
    name="MAGI2_VLLM_OMNI",
    kind="boolean",
    default=True,
    help="The vLLM plugin routes vllm-omni's MAGI-2 attention, MoE and RMSNorm to magi2-core when vllm-omni "
    "0.30.x is installed; 0 leaves vllm-omni's own operators in place. Read once, when vLLM loads the plugin "
    "(the swap happens then, before any model is built).",
    read="plugin load",
)


def _swap(name: str, what: str, ops: str, fused: str, why_not: str = "") -> Setting:
    """An ``auto`` / on / off switch of one more swap the plugin makes (each read once, at plugin load)."""
    return Setting(
        name=name,
        kind="choice",
        choices=("auto", *config.TRUE_WORDS, *config.FALSE_WORDS),
        default="auto",
        help=f"Whether the vLLM plugin also routes {what} to magi2-core's {ops}. `auto`: where a typical call "
        f"resolves to a fused provider (on CUDA, {fused}), not where it resolves to `reference` or "
        f"`torch_native`{why_not}; 1/true/yes/on: always; 0/false/no/off: never. Read once, when vLLM loads "
        "the plugin, like MAGI2_VLLM_OMNI.",
        read="plugin load",
    )


VLLM_OMNI_MHC = _swap(
    "MAGI2_VLLM_OMNI_MHC",
    "each MAGI-2 layer's mHC (its `_branch_logits`, `_branch_input` and `_connect`)",
    "`mhc_pre` / `mhc_mix`",
    "the Triton mHC",
    ", which run vllm-omni's own math with no gain (a CPU; a MUSA GPU today)",
)
VLLM_OMNI_QK_ROPE = _swap(
    "MAGI2_VLLM_OMNI_QK_ROPE",
    "the q/k tail of each MAGI-2 attention's `project` (the per-head norm, `inverse_permute`, RoPE and the cast)",
    "`qk_norm_rope`",
    "the Triton kernel",
)
VLLM_OMNI_OUTPUT_GATE = _swap(
    "MAGI2_VLLM_OMNI_OUTPUT_GATE",
    "each MAGI-2 attention's `output` (the `permute` gather, the sigmoid gate and the cast before the output "
    "projection)",
    "`output_gate`",
    "the Triton kernel",
)
VLLM_OMNI_SHARED_EXPERTS = Setting(
    name="MAGI2_VLLM_OMNI_SHARED_EXPERTS",
    kind="boolean",
    default=True,
    help="Whether the vLLM plugin also replaces each MAGI-2 MoE layer's `_shared_experts` by the same math "
    "without the concatenation around its SwiGLU7 (the activation applied to each expert's half; bit for bit "
    "vllm-omni's result, no operator involved, so on everywhere by default); 0 keeps vllm-omni's form. Read "
    "once, when vLLM loads the plugin, like MAGI2_VLLM_OMNI.",
    read="plugin load",
)
ROUTER_BIAS_SOURCE = Setting(
    name="MAGI2_ROUTER_BIAS_SOURCE",
    kind="choice",
    choices=("ema", "main"),
    default="ema",
    help="The checkpoint bias vllm-omni's MAGI-2 MoE layers select experts with: `ema` "
    "(`router.expert_bias_ema`, vllm-omni's default) or `main` (`router.expert_bias`). Read on every "
    "forward of a MoE layer, as vllm-omni reads it, so a change takes effect at the next forward with the "
    "plugin on or off; a value that is neither raises `ConfigError` there (vllm-omni would take it as `ema`).",
)
# The switches of the swaps, read once when vLLM loads the plugin (and fixed then).
PLUGIN_LOAD = (VLLM_OMNI, VLLM_OMNI_MHC, VLLM_OMNI_QK_ROPE, VLLM_OMNI_OUTPUT_GATE, VLLM_OMNI_SHARED_EXPERTS)
SETTINGS = (*PLUGIN_LOAD, ROUTER_BIAS_SOURCE)

for _setting in SETTINGS:
    config.declare(_setting, OWNER)


def router_bias_source() -> str:
    """``ema`` or ``main``: ``MAGI2_ROUTER_BIAS_SOURCE`` as the environment holds it now."""
    return str(config.get(ROUTER_BIAS_SOURCE.name))
