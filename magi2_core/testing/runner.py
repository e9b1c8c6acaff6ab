"""Run conformance cases: the provider through the public op, the reference as the oracle.

Shared by the pytest plugin and ``magi2 check``. :func:`plan` chooses providers and devices and
generates the cases; :func:`run_case` runs one and returns a :class:`CaseResult` whose ``report``
is the readable failure text. The oracle is the ``reference`` provider on the CPU, through the same
public op, judged by the acceptance rule of the op's spec (:mod:`magi2_core.ops`); what is
generated, built and compared per op is the spec's, and this module is the same loop for every op.

What fails a case: the provider refuses a call its descriptor claims (over-claim), raises, returns
the wrong dtype, shape or device, writes to its inputs, disagrees with the reference beyond the
acceptance rule, or (when ``deterministic`` is asked) gives different bits on a second run; for
``moe_experts`` (its base cases), gives different bits with weights from ``prepare_moe_weights``
or, when it declares ``compiling``, inside ``torch.compile(fullgraph=True)``; or the contract does
not reject an invalid call with an input error.
"""

from __future__ import annotations

import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

import magi2_core as m2
from magi2_core.errors import InvalidInputError, ProviderNotEligibleError, ResolutionError
from magi2_core.model.capability import Capability
from magi2_core.model.problem import OPS, Feature, OpName, Problem
from magi2_core.ops import SPECS
from magi2_core.selection.dispatch import set_device_value_checks
from magi2_core.selection.registry import Registry, get_registry
from magi2_core.selection.resolver import resolve_problem, static_reasons
from magi2_core.testing.cases import Case
from magi2_core.testing.inputs import ARG_NAMES, Call, build_call, invalid_calls
from magi2_core.testing.op_cases import CASES, DEFAULT_MAX_TOKENS, generate_cases

__all__ = [
    "REFERENCE",
    "CaseResult",
    "KitReport",
    "Plan",
    "ProviderSkip",
    "Status",
    "ValidationCase",
    "available_device_types",
    "case_seed",
    "plan",
    "run_case",
    "run_kit",
]

REFERENCE = "reference"
Status = Literal["passed", "failed", "ineligible"]
_DEVICE_MODULES = ("cuda", "musa", "xpu", "npu", "mps")


def available_device_types() -> tuple[str, ...]:
    """Device types with a usable device in this process (always ``cpu``)."""
    found = ["cpu"]
    for name in _DEVICE_MODULES:
        mod = getattr(torch, name, None)
        is_available = getattr(mod, "is_available", None)
        try:
            if callable(is_available) and is_available():
                found.append(name)
        except Exception:  # a half-installed vendor extension must not break the kit
            continue
    return tuple(found)


def case_seed(seed: int, case_id: str) -> int:
    """Each case's own seed: independent of which other cases run, so ``-k`` reproduces one alone."""
    return zlib.crc32(f"{seed}:{case_id}".encode())


@dataclass(frozen=True)
class ValidationCase:
    """Invalid calls that the contract must reject before ``provider`` runs."""

    op: OpName
    provider: str
    device: str
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.op}[{self.provider}]-{self.device}-{self.dtype}-rejects-invalid-inputs"


AnyCase = Case | ValidationCase


@dataclass(frozen=True)
class ProviderSkip:
    """A provider the kit cannot run here (absent device, unavailable kernel), with the reason."""

    op: OpName
    provider: str
    reason: str

    @property
    def id(self) -> str:
        return f"{self.op}[{self.provider}]-skipped"


@dataclass
class CaseResult:
    case: AnyCase
    status: Status
    seed: int
    checks: list[str] = field(default_factory=list)
    report: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "op": self.case.op,
            "provider": self.case.provider,
            "device": self.case.device,
            "dtype": self.case.dtype,
            "status": self.status,
            "seed": self.seed,
            "checks": self.checks,
            "report": self.report,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class Plan:
    seed: int
    cases: list[AnyCase]
    skipped: list[ProviderSkip]
    capabilities: dict[tuple[str, str], Capability]


class _Failure(Exception):
    """One failed check; its message becomes the case report."""


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------
def _devices_for(cap: Capability, available: Sequence[str]) -> list[str]:
    if "*" in cap.device_types:
        return list(available)
    return [d for d in cap.device_types if d in available]


def _availability(cap: Capability, device: str, registry: Registry) -> str | None:
    """Why the provider cannot run at all on ``device`` (every claimed dtype refused), or None."""
    refusals: list[str] = []
    for dtype in cap.dtypes:
        problem = Problem(op=cap.op, device_type=device, dtype=dtype)
        try:
            resolve_problem(problem, cap.name, registry)
            return None
        except ResolutionError as exc:
            res = exc.resolution
            reasons = [] if res is None else [r for c in res.candidates if c.provider == cap.name for r in c.reasons]
            refusals.append(f"{dtype}: " + "; ".join(map(str, reasons)))
    return f"unavailable on {device}: " + " | ".join(refusals)


def plan(
    providers: Iterable[str] | None = None,
    *,
    ops: Iterable[OpName] | None = None,
    devices: Iterable[str] | None = None,
    seed: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    registry: Registry | None = None,
) -> Plan:
    """Choose the providers (all installed when ``providers`` is None) and generate their cases.

    A requested name that no op knows is a :class:`ValueError` listing the installed ones. Providers
    whose device types are absent here, or whose kernel refuses every claimed dtype (not importable,
    no suitable device), are returned in ``skipped`` with the reason.
    """
    reg = registry or get_registry()
    wanted = None if providers is None else list(dict.fromkeys(providers))
    if wanted is not None and "all" in wanted:
        wanted = None
    op_list = list(ops or OPS)
    present = available_device_types()
    if devices is not None:
        present = tuple(d for d in present if d in set(devices))
    installed = {p.name for op in op_list for p in reg.providers(op)}
    if wanted is not None:
        unknown = [n for n in wanted if n not in installed]
        if unknown:
            raise ValueError(f"no installed provider named {unknown} for {op_list}; installed: {sorted(installed)}")
    cases: list[AnyCase] = []
    skipped: list[ProviderSkip] = []
    caps: dict[tuple[str, str], Capability] = {}
    for op in op_list:
        for p in sorted(reg.providers(op), key=lambda p: p.name):
            cap = p.capability
            if wanted is not None and cap.name not in wanted:
                continue
            caps[(op, cap.name)] = cap
            devs = _devices_for(cap, present)
            if not devs:
                skipped.append(
                    ProviderSkip(
                        op,
                        cap.name,
                        f"device types {list(cap.device_types)} not present here (available: {list(present)})",
                    )
                )
                continue
            for device in devs:
                why = _availability(cap, device, reg)
                if why is not None:
                    skipped.append(ProviderSkip(op, cap.name, why))
                    continue
                cases.extend(generate_cases(cap, device, max_tokens=max_tokens))
                cases.append(ValidationCase(op, cap.name, device, cap.dtypes[0]))
    return Plan(seed, cases, skipped, caps)


# ---------------------------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------------------------
def _op(op: str) -> Callable[..., Any]:
    fn: Callable[..., Any] = getattr(m2, op)
    return fn


def _unchanged(old: torch.Tensor, new: torch.Tensor) -> bool:
    """``new`` holds ``old``'s values (a NaN input stays NaN: cases plant non-finite inputs)."""
    if torch.equal(old, new):
        return True
    if old.shape != new.shape or old.dtype != new.dtype or not old.is_floating_point():
        return False
    return bool(((old == new) | (old.isnan() & new.isnan())).all())


def _check_layout(case: Case, call: Call, got: dict[str, torch.Tensor]) -> None:
    for name, (shape, dtypes) in CASES[case.op].layout(call).items():
        t = got.get(name)
        if not isinstance(t, torch.Tensor):
            raise _Failure(f"output '{name}' missing: got {type(t).__name__}")
        if list(t.shape) != shape or t.dtype not in dtypes:
            want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise _Failure(
                f"output '{name}' is {str(t.dtype).removeprefix('torch.')}{list(t.shape)}; "
                f"the contract says {want}{shape}"
            )
        if t.device.type != case.device:
            raise _Failure(f"output '{name}' is on {t.device}, inputs on {case.device}")


def _accept(
    case: Case, problem: Problem, got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], call: Call
) -> list[str]:
    spec = SPECS[case.op]
    results = spec.accept(problem, got, ref, spec.validate_arguments(call.args, call.kwargs))
    for r in results:
        if not r.ok:
            raise _Failure(f"disagrees with the reference beyond the contract: {r}")
    return [str(r) for r in results]


def _run_provider(case: Case, call: Call, provider: str) -> dict[str, torch.Tensor]:
    out = _op(case.op)(*call.args, **call.kwargs, provider=provider)
    return SPECS[case.op].outputs(out)


def _header(case: AnyCase, seed: int, kit_seed: int, cap: Capability | None) -> str:
    backend = f" (backend {cap.backend} {cap.version})" if cap is not None and cap.backend else ""
    return (
        f"magi2 conformance: {case.op} provider '{case.provider}'{backend} on {case.device}, {case.dtype}\n"
        f"case: {case.id}\n"
        f'seed: case {seed} (reproduce: magi2 check --seed {kit_seed} -k "{case.id}", '
        f'or pytest --magi2-seed {kit_seed} -k "{case.id}")'
    )


def _run_validation(case: ValidationCase, seed: int) -> list[str]:
    # Bad values on an accelerator (an expert id out of range) are only caught with the opt-in,
    # host-syncing device-value checks; the kit asks for them so that it can demand a clean error.
    previous = set_device_value_checks(True)
    try:
        return _invalid_calls_rejected(case, seed)
    finally:
        set_device_value_checks(previous)


def _invalid_calls_rejected(case: ValidationCase, seed: int) -> list[str]:
    checks = []
    for what, call in invalid_calls(case.op, case.dtype, case.device, seed).items():
        try:
            _op(case.op)(*call.args, **call.kwargs, provider=case.provider)
        except InvalidInputError as exc:
            checks.append(f"rejected: {what} ({type(exc).__name__})")
            continue
        except Exception as exc:
            raise _Failure(
                f"invalid call ({what}) raised {type(exc).__name__}: {exc} "
                f"instead of an InvalidInputError from the op contract"
            ) from exc
        raise _Failure(f"invalid call ({what}) was accepted; it must raise an InvalidInputError")
    return checks


def _run_case(case: Case, cap: Capability, seed: int) -> tuple[Status, list[str]]:
    call = build_call(case, seed)
    problem = m2.resolve(case.op, *call.args, **call.kwargs, provider=REFERENCE).problem
    reasons = static_reasons(cap, problem)
    if reasons:  # a rule fired (ranges are respected by generation): ineligible is not a failure
        return "ineligible", [f"not eligible by its descriptor: {r}" for r in reasons]
    checks = [f"inputs: {call.describe(ARG_NAMES[case.op])}"]
    before = [(n, t.clone()) for n, t in call.tensors()]
    try:
        got = _run_provider(case, call, case.provider)
    except ProviderNotEligibleError as exc:
        res = exc.resolution
        why = [] if res is None else [str(r) for c in res.candidates if c.provider == case.provider for r in c.reasons]
        raise _Failure(
            "OVER-CLAIM: the descriptor claims this case but the provider refused it at run time:\n  "
            + "\n  ".join(why or [str(exc)])
            + "\n  (fix: declare the limit in the descriptor (dtypes, head_dims, ranges, features, rules)"
            " or make the kernel serve it)"
        ) from exc
    except Exception as exc:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
        raise _Failure(f"CRASH inside the claimed capability: {type(exc).__name__}: {exc}\n{tb}") from exc
    _check_layout(case, call, got)
    checks.append("output dtype, shape and device match the contract")
    for (name, old), (_, new) in zip(before, call.tensors(), strict=True):
        if not _unchanged(old, new):
            raise _Failure(f"the provider wrote into its input '{name}'")
    if case.provider == REFERENCE and case.device == "cpu":
        checks.append("oracle is this provider itself on the CPU: agreement holds by construction")
    else:
        on_cpu = call.to("cpu")
        ref = _run_provider(case, on_cpu, REFERENCE)
        checks += _accept(case, problem, {k: v.cpu() for k, v in got.items()}, ref, on_cpu)
    if case.p.get("deterministic"):
        again = _run_provider(case, call, case.provider)
        for name, t in got.items():
            if not torch.equal(t, again[name]):
                raise _Failure(
                    f"deterministic=True was asked but a second run changed '{name}' "
                    f"({int((t != again[name]).sum())} elements differ)"
                )
        checks.append("deterministic: a second run is bitwise identical")
    if case.op == "moe_experts" and case.label == "base":  # once per dtype: each is a full extra run
        checks += _moe_weight_paths(case, cap, call, got["y"])
    return "passed", checks


def _moe_weight_paths(case: Case, cap: Capability, call: Call, y: torch.Tensor) -> list[str]:
    """Prepared weights (the provider's own layout) and a compiled call give the eager raw bits."""
    x, probs, idx, *weights = call.args
    try:
        prepared = m2.prepare_moe_weights(*weights, provider=case.provider)
    except Exception as exc:
        raise _Failure(f"prepare_moe_weights(provider={case.provider!r}) raised {type(exc).__name__}: {exc}") from exc
    again = m2.moe_experts(x, probs, idx, prepared, **call.kwargs, provider=case.provider)
    if not torch.equal(again, y):
        raise _Failure(
            f"weights prepared as {prepared.layout!r} changed the output "
            f"({int((again != y).sum())} elements differ from the raw-weight call)"
        )
    checks = [f"prepared weights ({prepared.layout}) give the raw-weight bits"]
    if Feature.COMPILING in cap.features and case.dtype == cap.dtypes[0]:
        # The dynamo frontend is what the `compiling` feature is about (the op stays opaque to any
        # backend, so one dtype is enough); the eager backend keeps the check cheap.
        def fn(x: torch.Tensor, probs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = m2.moe_experts(x, probs, idx, prepared, **call.kwargs, provider=case.provider)
            return out

        compiled = torch.compile(fn, fullgraph=True, backend="eager", dynamic=False)(x, probs, idx)
        if not torch.equal(compiled, y):
            raise _Failure(
                f"inside torch.compile(fullgraph=True) the output changed "
                f"({int((compiled != y).sum())} elements differ from the eager call)"
            )
        checks.append("torch.compile(fullgraph=True) with prepared weights gives the eager bits")
    return checks


def run_case(case: AnyCase, kit_seed: int, cap: Capability | None = None) -> CaseResult:
    """Run one case; never raises for a provider's fault (the result says what went wrong)."""
    seed = case_seed(kit_seed, case.id)
    if cap is None:
        loaded = get_registry().provider(case.op, case.provider)
        if loaded is None:
            raise ValueError(f"{case.op}: provider {case.provider!r} is not registered")
        cap = loaded.capability
    start = time.perf_counter()
    try:
        if isinstance(case, ValidationCase):
            status: Status = "passed"
            checks = _run_validation(case, seed)
        else:
            status, checks = _run_case(case, cap, seed)
        report = ""
    except _Failure as exc:
        status, checks = "failed", []
        report = f"{_header(case, seed, kit_seed, cap)}\nFAILED: {exc}"
        if isinstance(case, Case):
            report += f"\ninputs: {build_call(case, seed).describe(ARG_NAMES[case.op])}"
    return CaseResult(case, status, seed, checks, report, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# the whole kit
# ---------------------------------------------------------------------------------------------
@dataclass
class KitReport:
    seed: int
    results: list[CaseResult]
    skipped: list[ProviderSkip]

    @property
    def failed(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> list[dict[str, Any]]:
        """One row per (op, provider, device): counts of passed, failed and ineligible cases."""
        rows: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in self.results:
            key = (r.case.op, r.case.provider, r.case.device)
            row = rows.setdefault(
                key,
                {
                    "op": key[0],
                    "provider": key[1],
                    "device": key[2],
                    "passed": 0,
                    "failed": 0,
                    "ineligible": 0,
                    "seconds": 0.0,
                },
            )
            row[r.status] += 1
            row["seconds"] += r.seconds
        for s in self.skipped:
            rows[(s.op, s.provider, "-")] = {
                "op": s.op,
                "provider": s.provider,
                "device": "-",
                "passed": 0,
                "failed": 0,
                "ineligible": 0,
                "seconds": 0.0,
                "skipped": s.reason,
            }
        return list(rows.values())

    def format(self) -> str:
        """Plain-text report: every failure in full, then one summary line."""
        parts = [r.report for r in self.failed]
        parts += [f"SKIPPED {s.op}[{s.provider}]: {s.reason}" for s in self.skipped]
        n = {s: sum(r.status == s for r in self.results) for s in ("passed", "failed", "ineligible")}
        parts.append(
            f"magi2 conformance (seed {self.seed}): {n['passed']} passed, {n['failed']} failed, "
            f"{n['ineligible']} ineligible by rule, {len(self.skipped)} provider(s) skipped"
        )
        return "\n\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "summary": self.summary(),
            "skipped": [{"op": s.op, "provider": s.provider, "reason": s.reason} for s in self.skipped],
            "results": [r.as_dict() for r in self.results],
        }


def run_kit(
    providers: Iterable[str] | None = None,
    *,
    ops: Iterable[OpName] | None = None,
    devices: Iterable[str] | None = None,
    seed: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    on_result: Callable[[CaseResult, int, int], None] | None = None,
    kit_plan: Plan | None = None,
) -> KitReport:
    """Plan and run the kit; ``on_result(result, done, total)`` is called after every case."""
    p = kit_plan or plan(providers, ops=ops, devices=devices, seed=seed, max_tokens=max_tokens)
    results = []
    for i, case in enumerate(p.cases, 1):
        result = run_case(case, p.seed, p.capabilities.get((case.op, case.provider)))
        results.append(result)
        if on_result is not None:
            on_result(result, i, len(p.cases))
    return KitReport(p.seed, results, p.skipped)
