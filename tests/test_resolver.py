"""Resolution: precedence of overrides, every reason code, caching, threads and tasks."""

from __future__ import annotations

import asyncio
import copy
import sys
import threading
import types
from collections.abc import Iterator, Sequence

import pytest
import torch

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Condition, Feature, IntRange, Problem, Rule
from magi2_core.errors import NoEligibleProviderError, ProviderNotEligibleError, UnknownProviderError
from magi2_core.model.capability import Provenance
from magi2_core.ops.rmsnorm import SPEC as RMSNORM_SPEC
from magi2_core.ops.rmsnorm import RMSNormCall, RMSNormKey
from magi2_core.reasons import Reason, ReasonCode, Verdict
from magi2_core.selection import overrides
from magi2_core.selection.dispatch import Dispatcher
from magi2_core.selection.registry import Registry
from magi2_core.selection.resolver import resolve_problem

TOY = "magi2_toy_kernels"


class Tagged:
    """An rmsnorm kernel that fills its output with a tag, so a test can see who ran."""

    def __init__(self, tag: float, refuse: str | None = None) -> None:
        self.tag = tag
        self.refuse = refuse
        self.calls = 0

    def check(self, problem: Problem) -> Sequence[Reason]:
        if self.refuse is not None and problem.dtype == self.refuse:
            return [Reason(code=ReasonCode.CHECK, field="dtype", expected="not " + self.refuse, actual=problem.dtype)]
        return []

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        self.calls += 1
        return torch.full(call.x.shape, self.tag, dtype=call.out_dtype)


@pytest.fixture
def toy_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType(TOY)
    mod.low = Tagged(1.0)  # type: ignore[attr-defined]
    mod.high = Tagged(2.0)  # type: ignore[attr-defined]
    mod.picky = Tagged(3.0, refuse="float16")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, TOY, mod)
    return mod


def _backend(name: str, caps: tuple[Capability, ...]) -> types.ModuleType:
    plugin = types.ModuleType(f"{name}_plugin")

    def magi2_backend() -> BackendSpec:
        return BackendSpec(name=name, version="0.0.0", core_api=">=2.0,<3", providers=caps)

    plugin.magi2_backend = magi2_backend  # type: ignore[attr-defined]
    return plugin


def _norm(name: str, attr: str, priority: int, **extra: object) -> Capability:
    return Capability(
        op="rmsnorm",
        name=name,
        impl=f"{TOY}:{attr}",
        device_types=("cpu",),  # type: ignore[arg-type]
        dtypes=("float32", "float16"),
        priority=priority,
        **extra,
    )


@pytest.fixture
def toy_global(toy_module: types.ModuleType) -> Iterator[None]:
    """Two toy rmsnorm providers in the process-wide registry: 'toy_high' (prio 50), 'toy_low' (prio -50)."""
    reg = m2.get_registry()
    reg.register(_backend("toy-dist", (_norm("toy_high", "high", 50), _norm("toy_low", "low", -50))), name="toy")
    yield
    reg.unregister("toy")


def _tag(**kw: object) -> float:
    return float(m2.rmsnorm(torch.randn(2, 4), torch.zeros(1, 1, 4), **kw)[0, 0])  # type: ignore[arg-type]


def test_precedence_argument_context_env_priority(toy_global: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tag() == 2.0  # priority
    monkeypatch.setenv("MAGI2_RMSNORM_PROVIDER", "toy_low")
    m2.reload_config()
    assert _tag() == 1.0  # env beats priority
    with m2.use(rmsnorm="toy_high"):
        assert _tag() == 2.0  # context beats env
        with m2.use(rmsnorm="toy_low"):
            assert _tag() == 1.0  # inner context wins
            assert _tag(provider="toy_high") == 2.0  # argument beats context
        with m2.use(rmsnorm=None):
            assert _tag() == 1.0  # lifting the context override falls back to env
    monkeypatch.delenv("MAGI2_RMSNORM_PROVIDER")
    m2.reload_config()
    assert _tag() == 2.0


def test_resolution_records_who_decided(toy_global: None, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = torch.randn(2, 4), torch.zeros(1, 1, 4)
    assert m2.resolve("rmsnorm", x, w).decided_by == "priority"
    monkeypatch.setenv("MAGI2_RMSNORM_PROVIDER", "toy_low")
    m2.reload_config()
    res = m2.resolve("rmsnorm", x, w)
    assert (res.decided_by, res.override, res.chosen) == ("env", "toy_low", "toy_low")
    with m2.use(rmsnorm="reference"):
        assert m2.resolve("rmsnorm", x, w).decided_by == "context"
        res = m2.resolve("rmsnorm", x, w, provider="toy_high")
    assert res.decided_by == "argument"
    skipped = [c for c in res.candidates if c.verdict == Verdict.SKIPPED]
    assert skipped and all(c.reasons[0].code == ReasonCode.OVERRIDDEN for c in skipped)


def test_family_override_applies_to_both_moe_ops() -> None:
    x = torch.randn(3, 2, 8)
    with m2.use(moe="reference"):
        res = m2.resolve("moe_route", x, torch.randn(8, 8), None, top_k=2)
    assert (res.decided_by, res.chosen) == ("context", "reference")


def test_unknown_provider_lists_valid_names() -> None:
    with pytest.raises(UnknownProviderError) as err:
        _tag(provider="no_such_provider")
    assert "no_such_provider" in str(err.value) and "reference" in str(err.value)
    with pytest.raises(UnknownProviderError), m2.use(attention="nope"):  # on entry, before any call
        pytest.fail("use() entered with an unknown provider name")
    with pytest.raises(m2.InvalidInputError):
        with m2.use(attn="reference"):
            pass


def test_forced_provider_that_cannot_serve_raises_with_reasons() -> None:
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4])
    with pytest.raises(ProviderNotEligibleError) as err:
        m2.attention(q, q, q, cu, cu, provider="torch_varlen")
    res = err.value.resolution
    assert res is not None and res.chosen is None
    (cand,) = [c for c in res.candidates if c.provider == "torch_varlen"]
    assert {r.code for r in cand.reasons} >= {ReasonCode.DEVICE_TYPE, ReasonCode.DTYPE}
    assert "torch_varlen" in str(err.value) and "device_type" in str(err.value)


def _problem(**kw: object) -> Problem:
    base: dict[str, object] = dict(
        op="rmsnorm",
        device_type="cpu",
        dtype="float32",
        tokens=64,
        width=128,
        num_modalities=1,
        num_patterns=1,
        out_dtype="float32",
    )
    base.update(kw)
    return Problem(**base)  # type: ignore[arg-type]


def test_every_static_reason_code(toy_module: types.ModuleType) -> None:
    rule = Rule(
        id="toy-rule",
        when=(Condition(field="tokens", op="lt", value=32),),
        reason="too short",
        provenance=Provenance(kind="policy", source="test"),
    )
    cap = _norm("strict", "high", 9, out_dtypes=("float32",), ranges=(IntRange(field="width", max=256),), rules=(rule,))
    attn = Capability(
        op="attention",
        name="attn",
        impl=f"{TOY}:high",
        device_types=("cpu",),
        dtypes=("float16",),
        head_dims=(64,),
        features=frozenset(),
    )
    reg = Registry(discover=False)
    reg.register(_backend("strict-dist", (cap, attn)), name="strict")
    bad = _problem(device_type="musa", dtype="bfloat16", out_dtype="bfloat16", width=512, tokens=8)
    with pytest.raises(NoEligibleProviderError) as err:
        resolve_problem(bad, registry=reg)
    res = err.value.resolution
    assert res is not None
    codes = {r.code for r in res.candidates[0].reasons}
    assert codes == {ReasonCode.DEVICE_TYPE, ReasonCode.DTYPE, ReasonCode.OUT_DTYPE, ReasonCode.RANGE, ReasonCode.RULE}
    rule_reason = next(r for r in res.candidates[0].reasons if r.code == ReasonCode.RULE)
    assert rule_reason.field == "toy-rule" and "policy: test" in rule_reason.detail
    aprob = Problem(
        op="attention", device_type="cpu", dtype="float16", head_dim=128, features=frozenset({Feature.SINKS})
    )
    with pytest.raises(NoEligibleProviderError) as err:
        resolve_problem(aprob, registry=reg)
    res = err.value.resolution
    assert res is not None
    assert {r.code for r in res.candidates[0].reasons} == {ReasonCode.HEAD_DIM, ReasonCode.FEATURE}
    assert "attention" in res.explain() and "head_dim" in res.explain()


def test_runtime_reason_codes_and_not_reached(toy_module: types.ModuleType) -> None:
    ghost = Capability(
        op="rmsnorm", name="ghost", impl="no_such_module_q:k", device_types=("cpu",), dtypes=("float16",), priority=30
    )
    reg = Registry(discover=False)
    reg.register(_backend("rt", (ghost, _norm("picky", "picky", 20), _norm("low", "low", 10))), name="rt")
    res = resolve_problem(_problem(dtype="float16"), registry=reg)
    verdicts = {c.provider: (c.verdict, [r.code for r in c.reasons]) for c in res.candidates}
    assert verdicts["ghost"] == (Verdict.REJECTED, [ReasonCode.UNAVAILABLE])
    assert verdicts["picky"] == (Verdict.REJECTED, [ReasonCode.CHECK])
    assert verdicts["low"] == (Verdict.CHOSEN, [])
    res = resolve_problem(_problem(dtype="float32"), registry=reg)
    verdicts = {c.provider: (c.verdict, [r.code for r in c.reasons]) for c in res.candidates}
    assert verdicts["picky"] == (Verdict.CHOSEN, [])
    assert verdicts["low"] == (Verdict.SKIPPED, [ReasonCode.NOT_REACHED])
    assert res.model_dump_json()  # the record is JSON-dumpable


def test_cache_buckets_by_rule_boundaries_and_invalidates(
    toy_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # use() checks names against the process registry; this test's providers live in a private one
    monkeypatch.setattr(overrides, "_name_check", None)
    rule = Rule(
        id="short",
        when=(Condition(field="tokens", op="lt", value=32),),
        reason="r",
        provenance=Provenance(kind="policy", source="test"),
    )
    reg = Registry(discover=False)
    reg.register(_backend("c", (_norm("fast", "high", 9, rules=(rule,)), _norm("slow", "low", 1))), name="c")
    disp = Dispatcher(reg)
    builds: list[int] = []

    def problem(key: RMSNormKey) -> Problem:
        builds.append(key.tokens)
        return _problem(tokens=key.tokens)

    spec = copy.copy(RMSNORM_SPEC)  # the op's spec, its problems recorded
    spec.problem = problem  # type: ignore[method-assign]

    def kernel(tokens: int) -> object:
        return disp.kernel(spec, RMSNormKey("cpu", "float32", "float32", 0, tokens, 128, 1, 1), None).kernel

    assert kernel(100) is toy_module.high
    assert kernel(4000) is toy_module.high and kernel(33) is toy_module.high
    assert builds == [100]  # same side of the boundary: one resolution
    assert kernel(31) is toy_module.low and kernel(5) is toy_module.low
    assert builds == [100, 31]
    with m2.use(rmsnorm="slow"):
        assert kernel(100) is toy_module.low
    assert builds == [100, 31, 100]
    reg.register(_backend("d", (_norm("faster", "picky", 99),)), name="d")  # plugin change clears the cache
    assert kernel(100) is toy_module.picky


def test_thread_and_task_isolation_of_overrides(toy_global: None) -> None:
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        name, tag = ("toy_low", 1.0) if i % 2 else ("toy_high", 2.0)
        barrier.wait()
        with m2.use(rmsnorm=name):
            for _ in range(200):
                got = _tag()
                if got != tag:
                    errors.append(f"thread {i}: expected {tag}, got {got}")
                    return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    async def task(name: str, tag: float) -> bool:
        with m2.use(rmsnorm=name):
            await asyncio.sleep(0)
            ok = _tag() == tag
            await asyncio.sleep(0)
            return ok and _tag() == tag

    async def main() -> list[bool]:
        return list(
            await asyncio.gather(*(task("toy_low", 1.0) if i % 2 else task("toy_high", 2.0) for i in range(10)))
        )

    assert all(asyncio.run(main()))


def test_resolve_never_runs_a_kernel(toy_global: None, toy_module: types.ModuleType) -> None:
    res = m2.resolve("rmsnorm", torch.randn(2, 4), torch.zeros(1, 1, 4))
    assert res.chosen == "toy_high" and toy_module.high.calls == 0
    _tag()
    assert toy_module.high.calls == 1


def test_an_unknown_use_name_raises_on_entry_listing_the_valid_ones() -> None:
    entered = False
    with pytest.raises(
        m2.UnknownProviderError, match=r"attention: no provider named 'refrence' \(use\(attention="
    ) as exc:
        with m2.use(attention="refrence"):
            entered = True
    assert not entered and "'reference'" in str(exc.value)
    with pytest.raises(m2.UnknownProviderError, match="moe_route: no provider named 'torch_varlen'"):
        with m2.use(moe_route="torch_varlen"):  # an attention provider: no moe_route provider has that name
            pass
    with m2.use(moe="reference", attention=None):  # a name of the family's ops: fine
        pass


def test_an_unknown_env_provider_is_reported_by_any_op_not_only_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAGI2_ATTENTION_PROVIDER=flash once let rmsnorm run and failed only at the first attention call."""
    monkeypatch.setenv("MAGI2_ATTENTION_PROVIDER", "flash")
    m2.reload_config()
    try:
        with pytest.raises(
            m2.UnknownProviderError, match=r"'flash' \(env override MAGI2_ATTENTION_PROVIDER\); installed"
        ):
            m2.rmsnorm(torch.randn(3, 20), torch.zeros(20))
    finally:
        monkeypatch.delenv("MAGI2_ATTENTION_PROVIDER")
        m2.reload_config()
    assert m2.rmsnorm(torch.randn(3, 20), torch.zeros(20)).shape == (3, 20)
