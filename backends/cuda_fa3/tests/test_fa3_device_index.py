"""A multi-GPU host may mix models: FA3's run-time check asks the problem's device, not the current one."""

from __future__ import annotations

import types

from magi2_backend_cuda_fa3.provider import FA3Attention

from magi2_core import Problem


def test_check_reads_the_capability_of_the_problems_device() -> None:
    problems = [Problem(op="attention", device_type="cuda", device_index=i, dtype="bfloat16") for i in (0, 1)]
    seen: list[int | None] = []
    caps = {0: (9, 0), 1: (8, 0)}

    def capability(index: int | None) -> tuple[int, int] | None:
        seen.append(index)
        return caps[index or 0]

    class _Loaded:
        abi = types.SimpleNamespace(cc_majors=(9,), label="fake", sm8x=False, fp16=True, softcap=True, params=())

        def why_none(self) -> str:
            return ""

    fa3 = FA3Attention(loader=lambda: _Loaded(), capability=capability)  # type: ignore[arg-type,return-value]
    assert fa3.check(problems[0]) == []
    (why,) = fa3.check(problems[1])
    assert why.field == "compute_capability" and why.actual == "8.0" and seen == [0, 1]
