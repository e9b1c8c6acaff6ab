"""Descriptors of the example backend (cheap: no kernel imports)."""

from magi2_core.backend import BackendSpec, Capability, Condition, Provenance, Rule


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-example",
        version="0.0.1",
        core_api=">=2.0,<3",
        providers=(
            # A made-up accelerator: proves the device-type set is open to third parties.
            Capability(
                op="attention",
                name="example_fpga",
                impl="magi2_example_backend.kernels:fpga_attention",
                device_types=("fpga",),
                dtypes=("bfloat16",),
                head_dims=(64, 128),
                priority=40,
                rules=(
                    Rule(
                        id="example-fpga-short",
                        when=(Condition(field="max_seqlen_q", op="lt", value=64),),
                        reason="the example device pads to 64-token tiles",
                        provenance=Provenance(kind="policy", source="tests/plugins/example"),
                    ),
                ),
            ),
            # A CPU provider ranked below the reference: used only when forced (provider="example").
            Capability(
                op="rmsnorm",
                name="example",
                impl="magi2_example_backend.kernels:example_rmsnorm",
                device_types=("cpu",),
                dtypes=("float32", "bfloat16", "float16"),
                priority=-10,
            ),
        ),
        # Its device profile (package data): found by the registry, merged into the fpga profile.
        profiles=("magi2_example_backend:profiles/fpga.json",),
    )
