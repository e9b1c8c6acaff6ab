"""Resolution: from a :class:`Problem` to a provider, explained (memoised for the hot path by
:mod:`magi2_core.selection.dispatch`).

Order: overrides in fixed precedence (``provider=`` argument > ``use(...)`` > environment), else the
providers of the op in a total order, the first eligible wins: the providers that the active device
profile's first matching preference row lists (:mod:`magi2_core.profiles`), in its order, then the
others by priority descending, then name. So a preference never sends a call to a worse provider
because the preferred one cannot serve it: the next eligible one wins.
Eligibility = the descriptor's static checks (device type, dtype, head dim, ranges, features, rules)
then the kernel object's run-time ``check`` (imports, compute capability).

For a described device (``device=``, :class:`~magi2_core.model.virtual_device.VirtualDevice`: ``magi2 explain
--device-name``), the profile is the one that device gets (:func:`~magi2_core.profiles.profile_of`) and the
run-time check is the kernel object's ``check_on`` (:class:`~magi2_core.model.kernel.CheckableOn`), or its
``check`` without the reason that this host lacks the device. Calls of the ops never pass ``device``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from magi2_core.errors import (
    NoEligibleProviderError,
    ProviderNotEligibleError,
    UnknownProviderError,
)
from magi2_core.model.capability import Capability
from magi2_core.model.devices import absent_device
from magi2_core.model.kernel import Checkable, CheckableOn
from magi2_core.model.problem import OpName, Problem
from magi2_core.profiles.active import DeviceKey, profile_for, profile_of
from magi2_core.reasons import Candidate, DecidedBy, Reason, ReasonCode, Resolution, Verdict
from magi2_core.selection import overrides
from magi2_core.selection.overrides import FAMILY, env_overrides, env_var, key_ops, layered_overrides
from magi2_core.selection.registry import LoadedProvider, Registry, RegistryState, get_registry

if TYPE_CHECKING:
    from magi2_core.model.virtual_device import VirtualDevice

__all__ = ["resolve_in", "resolve_problem", "static_reasons"]


def static_reasons(cap: Capability, problem: Problem) -> list[Reason]:
    """Why the descriptor alone rules the provider out (empty: it does not)."""
    out: list[Reason] = []
    if problem.device_type not in cap.device_types and "*" not in cap.device_types:
        out.append(
            Reason(
                code=ReasonCode.DEVICE_TYPE,
                field="device_type",
                expected=" | ".join(cap.device_types),
                actual=problem.device_type,
            )
        )
    if problem.dtype not in cap.dtypes:
        out.append(Reason(code=ReasonCode.DTYPE, field="dtype", expected=" | ".join(cap.dtypes), actual=problem.dtype))
    if cap.out_dtypes is not None and problem.out_dtype is not None and problem.out_dtype not in cap.out_dtypes:
        out.append(
            Reason(
                code=ReasonCode.OUT_DTYPE,
                field="out_dtype",
                expected=" | ".join(cap.out_dtypes),
                actual=problem.out_dtype,
            )
        )
    if cap.head_dims is not None and problem.head_dim is not None and problem.head_dim not in cap.head_dims:
        out.append(
            Reason(
                code=ReasonCode.HEAD_DIM,
                field="head_dim",
                expected=" | ".join(map(str, cap.head_dims)),
                actual=str(problem.head_dim),
            )
        )
    for rng in cap.ranges:
        value = getattr(problem, rng.field)
        if value is not None and not rng.contains(value):
            out.append(Reason(code=ReasonCode.RANGE, field=rng.field, expected=str(rng), actual=str(value)))
    missing = sorted(f.value for f in problem.features - cap.features)
    for feat in missing:
        out.append(Reason(code=ReasonCode.FEATURE, field=feat, expected="supported", actual="requested"))
    for rule in cap.rules:
        if rule.fires(problem):
            out.append(
                Reason(
                    code=ReasonCode.RULE,
                    field=rule.id,
                    expected=f"not ({rule.describe()})",
                    actual="rule fired",
                    detail=f"{rule.reason}; source: {rule.provenance}",
                )
            )
    return out


def _runtime_reasons(provider: LoadedProvider, problem: Problem) -> list[Reason]:
    impl, error = provider.load()
    if error is not None:
        return [
            Reason(
                code=ReasonCode.UNAVAILABLE, field="impl", expected="importable", actual="import failed", detail=error
            )
        ]
    if isinstance(impl, Checkable):
        return list(impl.check(problem))
    return []


def _reasons_on(
    provider: LoadedProvider, problem: Problem, device: VirtualDevice
) -> tuple[list[Reason], tuple[str, ...]]:
    """:func:`_runtime_reasons` for a described device, and what was assumed (the candidate's notes)."""
    impl, error = provider.load()
    if error is not None:
        return _runtime_reasons(provider, problem), ()
    if isinstance(impl, CheckableOn):
        verdict = impl.check_on(problem, device)
        return list(verdict.reasons), tuple(verdict.assumed)
    if not isinstance(impl, Checkable):
        return [], ()
    host = absent_device(device.type)
    reasons = list(impl.check(problem))
    kept = [r for r in reasons if r not in host]
    note = "judged by its check on this host (it has no check_on for a described device)" + (
        "; the reason that this host has no such device was set aside" if len(kept) < len(reasons) else ""
    )
    return kept, (note,)


def _candidate(
    p: LoadedProvider, verdict: Verdict, reasons: Sequence[Reason] = (), notes: Sequence[str] = ()
) -> Candidate:
    c = p.capability
    return Candidate(
        provider=c.name,
        backend=c.backend,
        version=c.version,
        priority=c.priority,
        verdict=verdict,
        reasons=tuple(reasons),
        notes=tuple(notes),
    )


def valid_names(key: str, reg: RegistryState) -> list[str]:
    """The provider names an override key accepts: those of the installed providers of its ops."""
    return sorted({p.name for op in key_ops(key) for p in reg.providers[op]})


def invalid_env_overrides(reg: RegistryState) -> dict[str, tuple[str, list[str]]]:
    """Each ``MAGI2_*_PROVIDER`` naming no installed provider of its ops: variable -> (value, valid)."""
    bad: dict[str, tuple[str, list[str]]] = {}
    given = env_overrides()
    for key in overrides.KEYS:
        value = given.get(env_var(key))
        if value is not None and value not in (valid := valid_names(key, reg)):
            bad[env_var(key)] = (value, valid)
    return bad


def _unknown(key: str, name: str, source: str, valid: list[str]) -> UnknownProviderError:
    return UnknownProviderError(
        f"{key}: no provider named {name!r} ({source}); installed: {valid}. Check the name, or install "
        f"the backend that provides it (`magi2 backends` lists them)."
    )


def check_env_overrides(reg: RegistryState) -> None:
    """Raise for the first ``MAGI2_*_PROVIDER`` that names no installed provider of its ops."""
    for var, (value, valid) in invalid_env_overrides(reg).items():
        key = var.removeprefix("MAGI2_").removesuffix("_PROVIDER").lower()
        raise _unknown(key, value, f"env override {var}", valid)


def check_use_names(names: Mapping[str, str]) -> None:
    """``use(...)``'s names, on entry: each must be an installed provider of its key's ops."""
    reg = get_registry().state()
    for key, name in names.items():
        if name not in (valid := valid_names(key, reg)):
            raise _unknown(key, name, f"use({key}=...)", valid)


overrides.set_name_check(check_use_names)


def _forced(op: OpName, provider: str | None, reg: RegistryState) -> tuple[str, DecidedBy] | None:
    if provider is not None:
        return provider, "argument"
    for source, name, family_level in layered_overrides(op):
        if reg.provider(op, name) is not None or not family_level:
            return name, "context" if source == "context" else "env"
        siblings = [o for o, f in FAMILY.items() if f == FAMILY[op]]
        if not any(reg.provider(o, name) for o in siblings):
            return name, "context" if source == "context" else "env"
    return None


def resolve_problem(
    problem: Problem,
    provider: str | None = None,
    registry: Registry | None = None,
    *,
    device: VirtualDevice | None = None,
) -> Resolution:
    """Resolve ``problem`` without running anything; raise with the full Resolution if nothing fits.

    ``device``: resolve as that described device would (module doc; ``problem.device_type`` must be its
    type), not as this host's device of that type.

    Raises :class:`UnknownProviderError` for an override naming no installed provider,
    :class:`ProviderNotEligibleError` for a forced provider that cannot serve the problem, and
    :class:`NoEligibleProviderError` when no provider can.
    """
    return resolve_in(problem, provider, (registry or get_registry()).state(), device)


def resolve_in(
    problem: Problem, provider: str | None, reg: RegistryState, device: VirtualDevice | None = None
) -> Resolution:
    check_env_overrides(reg)  # a bad MAGI2_*_PROVIDER is reported at the first resolution of any op
    providers = reg.providers[problem.op]
    notes: dict[str, tuple[str, ...]] = {}  # a described device's assumptions, per provider
    runtime: Callable[[LoadedProvider], list[Reason]]
    if device is None:
        profile = profile_for(problem.device_type, problem.device_index, reg.profiles)

        def runtime(p: LoadedProvider) -> list[Reason]:
            return _runtime_reasons(p, problem)
    else:
        if device.type != problem.device_type:
            raise ValueError(
                f"a {problem.device_type} problem cannot be resolved for the described device {device}; "
                f"describe a {problem.device_type} device, or set the problem's device_type to {device.type}"
            )
        profile = profile_of(
            DeviceKey(device.type, device.name, device.capability), reg.profiles, profile=device.profile
        )

        def runtime(p: LoadedProvider) -> list[Reason]:
            reasons, notes[p.name] = _reasons_on(p, problem, device)
            return reasons

    forced = _forced(problem.op, provider, reg)
    candidates: list[Candidate] = []
    chosen: str | None = None
    if forced is not None:
        name, source = forced
        target = reg.provider(problem.op, name)
        if target is None:
            valid = [p.name for p in providers]
            raise UnknownProviderError(
                f"{problem.op}: no provider named {name!r} ({source} override); installed: {valid}. "
                f"Check the name, or install the backend that provides it (`magi2 backends` lists them)."
            )
        for p in providers:
            if p is target:
                reasons = static_reasons(p.capability, problem) or runtime(p)
                chosen = None if reasons else p.name
                candidates.append(
                    _candidate(p, Verdict.REJECTED if reasons else Verdict.CHOSEN, reasons, notes.get(p.name, ()))
                )
            else:
                candidates.append(
                    _candidate(
                        p,
                        Verdict.SKIPPED,
                        [
                            Reason(
                                code=ReasonCode.OVERRIDDEN,
                                field="provider",
                                expected=name,
                                actual=p.name,
                                detail=f"{source} override",
                            )
                        ],
                    )
                )
        res = Resolution(
            problem=problem,
            candidates=tuple(candidates),
            decided_by=source,
            override=name,
            chosen=chosen,
            quarantined=reg.quarantined,
            profile=profile.note,
            described=device,
        )
        if chosen is None:
            raise ProviderNotEligibleError(
                f"{problem.op}: provider {name!r} was forced ({source}) but cannot serve this call", res
            )
        return res
    row = profile.preference_for(problem)
    if row is not None:  # the listed providers first, in listed order; the others keep priority order
        rank = {name: i for i, name in enumerate(row.prefer)}
        providers = tuple(sorted(providers, key=lambda p: rank.get(p.name, len(rank))))
    for p in providers:
        reasons = static_reasons(p.capability, problem)
        if chosen is None:
            reasons = reasons or runtime(p)
            if not reasons:
                chosen = p.name
                candidates.append(_candidate(p, Verdict.CHOSEN, (), notes.get(p.name, ())))
                continue
            candidates.append(_candidate(p, Verdict.REJECTED, reasons, notes.get(p.name, ())))
        elif reasons:
            candidates.append(_candidate(p, Verdict.REJECTED, reasons))
        else:
            candidates.append(
                _candidate(
                    p,
                    Verdict.SKIPPED,
                    [
                        Reason(
                            code=ReasonCode.NOT_REACHED,
                            field="order",
                            expected=f"a rank before {chosen!r}",
                            actual="ranked after it",
                            detail="not probed: a provider earlier in the order was chosen",
                        )
                    ],
                )
            )
    res = Resolution(
        problem=problem,
        candidates=tuple(candidates),
        decided_by="profile" if row is not None and chosen in row.prefer else "priority",
        chosen=chosen,
        quarantined=reg.quarantined,
        profile=profile.note,
        described=device,
        preference=None if row is None else profile.preference_note(row),
    )
    if chosen is None:
        raise NoEligibleProviderError(f"{problem.op}: no installed provider can serve this call", res)
    return res
