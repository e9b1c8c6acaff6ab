"""Which kernel, tile and route alignment serve a fused-MoE call, as data: ``plan(problem) -> Plan``.

The choice comes from plan rows (the ``plans`` of a device profile, op ``moe_experts``, provider
``triton``): each row has ``when`` conditions (:class:`magi2_core.model.capability.Condition`, evaluated on
the call's :class:`~magi2_core.model.problem.Problem`) and a plan (``variant``, ``tile``, ``align``; the
vocabulary is `tiles.py`'s). This backend ships its rows as profile fragments in
``magi2_backend_triton/profiles/``, listed in its ``BackendSpec.profiles``: measured rows for the
NVIDIA H200 and H100, and generic rows per device class (other CUDA 9.x devices, other CUDA, MUSA,
the CPU interpreter). The core reads and merges them with the other profiles; `rows_for` asks the
core for this provider's rows on a device (:func:`magi2_core.backend.plan_rows`: a tuned or given
profile's rows first, then the shipped rows for the device, named or generic).

`plan_for` is the whole decision, in order:

1. The first row whose ``when`` holds and whose variant can run the problem correctly here
   (`variant_reason`: the device and this Triton build it, the kernel takes the shape, shared-memory
   and route-list budgets, determinism) wins. A row passed over for such a reason is named in the
   plan's ``why``. Every shipped fragment ends with a row that any problem of its device can run.
2. The row's ``align`` is made concrete (`alignment_for`): ``device`` is the measured rule (the
   stable kernels up to `STABLE_KERNELS_MAX_EXPERTS` flat experts and in deterministic mode, the
   atomic kernels above; without the alignment kernels, the torch statement when deterministic and
   the atomic kernels otherwise); a named alignment that cannot serve the call (deterministic mode
   needs a stable order, the stable kernels need CUDA outside the interpreter) falls back, and
   ``why`` says so.
3. Run-time state the problem does not carry: raw gate/up weights (not views of a bank that
   `magi2_core.prepare_moe_weights` packed) have no packed bank, and none is cached for them (a
   cached copy goes stale when the caller writes the weights in place by a route that bypasses
   autograd's version counter, ``.data.copy_`` among them). `without_bank` gives the plan such a
   call runs: the `one_kernel` variant with the same tile reading gate/up in place (the variants are
   bit-identical by test), ``why`` saying so. The launcher applies exactly this step.

`fused.run_fused` executes the plan it is given and never changes it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final, Literal, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from magi2_core.backend import (
    Condition,
    DeviceKey,
    Feature,
    InvalidValueError,
    Plan,
    Problem,
    Provenance,
    VirtualDevice,
    plan_rows,
    with_routes_per_expert,
)
from magi2_core.backend import PlanRow as ProfilePlanRow

from ..interpret import interpreting
from .gluon import gluon_device_reason, gluon_shape_reason
from .tiles import ONE_KERNEL, Alignment, Launch, Variant, launch_of
from .tma import tma_device_reason

__all__ = [
    "LIST_BUDGET",
    "STABLE_KERNELS_MAX_EXPERTS",
    "DeviceId",
    "PlanRow",
    "RowPlan",
    "alignment_for",
    "candidates_for",
    "choose_alignment",
    "described_id",
    "device_id",
    "plan_for",
    "plan_reason",
    "problem_of",
    "row_error",
    "rows_for",
    "variant_reason",
    "without_bank",
]

OP: Final = "moe_experts"
PROVIDER = "triton"

# Bytes of route lists ("gluon_routed") a call may allocate; past it that variant is passed over. The
# lists hold every expert's worst case, T*K routes (repeated top-k ids included): 38 MB at 2048
# tokens x 3 heads x 256 experts, 151 MB with 12 heads.
LIST_BUDGET = 64 * 2**20

# Up to this many flat experts the stable alignment kernels are at least as fast as the atomic ones
# (docs/moe-notes.md, "Route alignment without atomics"), so they serve the default mode too: one
# route order for both modes.
STABLE_KERNELS_MAX_EXPERTS = 1024

RowAlign = Literal["device", "atomic", "stable_kernels", "stable_torch", "lists"]


class DeviceId(NamedTuple):
    """The device a plan is made for: device type, name and compute capability (None: unknown)."""

    type: str
    name: str | None
    capability: tuple[int, int] | None

    def __str__(self) -> str:
        cap = "" if self.capability is None else f" {self.capability[0]}.{self.capability[1]}"
        return f"{self.type} {self.name!r}{cap}" if self.name else f"{self.type}{cap} (name unknown)"

    def key(self) -> DeviceKey:
        """The device as the core's profiles see it."""
        cap = None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"
        return DeviceKey(self.type, self.name, cap)


class RowPlan(BaseModel):
    """The plan a row names; ``align`` may be ``device`` (made concrete by `alignment_for`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: Variant
    tile: dict[str, int]
    align: RowAlign


class PlanRow(BaseModel):
    """One plan row of this provider (a profile's ``plans`` row, op ``moe_experts``), its plan typed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    when: tuple[Condition, ...] = ()
    plan: RowPlan
    why: str
    provenance: Provenance | None = None

    @classmethod
    def of(cls, row: ProfilePlanRow) -> PlanRow:
        """The core's row, its plan read (a pydantic ``ValidationError`` names what is wrong)."""
        return cls(when=row.when, plan=RowPlan.model_validate(dict(row.plan)), why=row.why, provenance=row.provenance)

    def matches(self, problem: Problem) -> bool:
        return all(c.holds(problem) for c in self.when)

    def cited(self) -> str:
        """The row's ``why`` and, where it has one, its provenance (kind: source, date, tool)."""
        p = self.provenance
        if p is None or not p.source:
            return self.why
        where = ", ".join(v for v in (p.source, p.date, p.tool) if v)
        return f"{self.why} [provenance: {p.kind}: {where}]"

    def launch(self, align: Alignment) -> Launch:
        """The row's kernel and tile with a concrete alignment (an error names a malformed tile)."""
        return launch_of(Plan(variant=self.plan.variant, tile=self.plan.tile, align=align, why=""))


def row_error(row: ProfilePlanRow) -> str | None:
    """Why this provider cannot read ``row``'s plan (an unknown variant, a malformed tile), or None."""
    try:
        mine = PlanRow.of(row)
        mine.launch("lists" if mine.plan.align == "lists" else "atomic")
    except (ValidationError, InvalidValueError) as e:
        return str(e)
    return None


def rows_for(device: DeviceId, profile: str | None = None) -> tuple[tuple[PlanRow, ...], str]:
    """The plan rows for ``device`` and where they come from (the text that opens every ``why``): the
    core's :func:`~magi2_core.backend.plan_rows` of this provider, whose order is the core's (a tuned or
    given profile's rows, then the rows this backend ships for the device); ``profile``, named as
    ``MAGI2_PROFILE`` names one, in its place (explain's ``--profile``)."""
    found = plan_rows(OP, PROVIDER, device.key(), profile=profile, check=row_error)
    if not found.rows:
        raise InvalidValueError(OP, "device", "a device with plan rows of this provider", found.source)
    return tuple(PlanRow.of(r) for r in found.rows), found.source


@functools.lru_cache(maxsize=16)
def device_id(device_type: str, index: int | None) -> DeviceId:
    """This host's device of ``device_type`` (index None: the current one); unknown name and capability
    where the type has none here (``magi2 explain --device cuda`` on a host without CUDA)."""
    if device_type == "cuda" and torch.cuda.is_available():
        i = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(i)
        return DeviceId("cuda", torch.cuda.get_device_name(i), (major, minor))
    musa = getattr(torch, "musa", None)
    if device_type == "musa" and musa is not None and musa.is_available():
        i = musa.current_device() if index is None else index
        return DeviceId("musa", str(musa.get_device_name(i)), None)
    return DeviceId(device_type, None, None)


def described_id(device: VirtualDevice) -> DeviceId:
    """A described device (``magi2 explain --device-name``) as fragments are matched against it."""
    return DeviceId(device.type, device.name, device.compute_capability)


def problem_of(problem: Problem) -> Problem:
    """``problem`` with ``routes_per_expert`` = ceil(tokens * top_k / num_experts) filled in (rows read it)."""
    return with_routes_per_expert(problem)


def _kernels_align(device: DeviceId) -> bool:
    """Do the alignment kernels of `align.py` serve here? (CUDA, not the interpreter, which sorts slowly;
    MUSA's Triton sort is untested here.)"""
    return device.type == "cuda" and not interpreting()


def choose_alignment(device: DeviceId, flat_experts: int, deterministic: bool) -> Alignment:
    """The ``device`` alignment rule (module docstring, step 2)."""
    if _kernels_align(device) and (deterministic or flat_experts <= STABLE_KERNELS_MAX_EXPERTS):
        return "stable_kernels"
    return "stable_torch" if deterministic else "atomic"


def _flat_experts(problem: Problem) -> int:
    return (problem.num_heads or 1) * (problem.num_experts or 1)


def alignment_for(row_align: RowAlign, problem: Problem, device: DeviceId) -> tuple[Alignment, str]:
    """The concrete alignment of a row's ``align`` for this call, and the reason when it is not the row's own."""
    det = Feature.DETERMINISTIC in problem.features
    flat = _flat_experts(problem)
    if row_align == "lists":
        return "lists", ""
    if row_align == "device":
        got = choose_alignment(device, flat, det)
        if got == "stable_kernels":
            return got, ""
        if _kernels_align(device):
            return got, (
                f"align atomic: {flat} flat experts > {STABLE_KERNELS_MAX_EXPERTS}, where the atomic kernels are faster"
            )
        stable = "; deterministic mode needs a stable route order" if det else ""
        return got, f"align {got}: the stable alignment kernels run on CUDA outside the interpreter only{stable}"
    if row_align == "atomic" and det:
        got = "stable_kernels" if _kernels_align(device) else "stable_torch"
        return got, f"align {got}: deterministic mode needs a stable route order"
    if row_align == "stable_kernels" and not _kernels_align(device):
        got = "stable_torch" if det else "atomic"
        return got, f"align {got}: the stable alignment kernels run on CUDA outside the interpreter only"
    return row_align, ""


def variant_reason(launch: Launch, problem: Problem, device: DeviceId) -> str | None:
    """Why ``launch`` cannot run ``problem`` correctly on ``device`` with this Triton, or None when it can."""
    v = launch.variant
    det = Feature.DETERMINISTIC in problem.features
    if det and launch.align in ("atomic", "lists"):
        return f"deterministic mode needs a stable route order, not {launch.align}"
    if launch.align == "stable_kernels" and not _kernels_align(device):
        return "the stable alignment kernels run on CUDA outside the interpreter only"
    if v == "two_kernel":
        return None
    assert launch.single is not None
    d, inter = problem.hidden or 0, problem.intermediate or 0
    if d < 1 or d & (d - 1) or inter % launch.single.block_i:
        return (
            f"the one-kernel path needs hidden a power of two and intermediate a multiple of BLOCK_I "
            f"{launch.single.block_i}; got {d} and {inter}"
        )
    if v == "tma":
        return tma_device_reason(device.type, device.capability)
    if v.startswith("gluon"):
        reason = gluon_device_reason(device.type, device.capability)
        if reason is None:
            reason = gluon_shape_reason(d, inter, getattr(torch, problem.dtype), launch.single, v)
        if reason is None and v == "gluon_routed":
            lists = 4 * _flat_experts(problem) * (problem.tokens or 0) * (problem.top_k or 0)
            if lists > LIST_BUDGET:
                reason = f"its route lists need {lists} B, more than the {LIST_BUDGET} B budget"
        return reason
    return None


def plan_reason(plan: Plan, problem: Problem, device: DeviceId) -> str | None:
    """Why ``plan`` cannot run ``problem`` correctly here (a malformed plan included), or None."""
    try:
        launch = launch_of(plan)
    except InvalidValueError as e:
        return str(e)
    return variant_reason(launch, problem, device)


def plan_for(problem: Problem, device: DeviceId, rows: Sequence[PlanRow], source: str) -> tuple[Plan, Launch]:
    """Steps 1 and 2 of the module docstring: the plan of ``problem`` on ``device`` under ``rows``."""
    problem = problem_of(problem)
    passed: list[str] = []
    for i, row in enumerate(rows, 1):
        if not row.matches(problem):
            continue
        align, align_why = alignment_for(row.plan.align, problem, device)
        launch = row.launch(align)
        reason = variant_reason(launch, problem, device)
        if reason is not None:
            passed.append(f"row {i} ({row.plan.variant}): {reason}")
            continue
        when = " and ".join(str(c) for c in row.when) or "every call"
        why = f"{source}; row {i} ({when}): {row.cited()}"
        why += "".join(f"; {w}" for w in (align_why, *(["passed over " + "; ".join(passed)] if passed else [])) if w)
        return Plan(variant=row.plan.variant, tile=dict(row.plan.tile), align=align, why=why), launch
    raise InvalidValueError(
        OP, "plan", f"a row of {source} that can run this call", "; ".join(passed) or "no row whose conditions hold"
    )


def without_bank(plan: Plan, problem: Problem, device: DeviceId) -> tuple[Plan, Launch]:
    """Step 3 of the module docstring: the plan of a call with raw gate/up (read in place, never packed)."""
    launch = launch_of(plan)
    tile = dict(plan.tile) | {"PACKED_W13": 0}
    variant: Variant = launch.variant
    if variant != "two_kernel":
        variant, tile = "one_kernel", tile | {"INTERLEAVED": 0}
    align = plan.align
    if align == "lists":
        align = choose_alignment(device, _flat_experts(problem), Feature.DETERMINISTIC in problem.features)
    if variant == launch.variant and tile == plan.tile and align == plan.align:
        return plan, launch
    why = (
        f"{plan.why}; raw gate/up have no packed bank (prepare_moe_weights makes one): "
        f"the {variant} kernel with the same tile reads them in place (bit-identical)"
    )
    new = Plan(variant=variant, tile=tile, align=align, why=why)
    return new, launch_of(new)


def candidates_for(problem: Problem, device: DeviceId, rows: Sequence[PlanRow], source: str) -> list[Plan]:
    """The plan of ``problem`` first, then every other (variant, tile) of ``rows`` with each alignment that
    can serve it, kept where it can run ``problem`` correctly here: what `magi2 tune` times."""
    chosen, _ = plan_for(problem, device, rows, source)
    problem = problem_of(problem)
    det = Feature.DETERMINISTIC in problem.features
    kernels = _kernels_align(device)
    out = [chosen]
    seen = {(chosen.variant, tuple(sorted(chosen.tile.items())), chosen.align)}
    aligned: tuple[Alignment, ...] = (
        (("stable_kernels",) if kernels else ("stable_torch",))
        if det
        else (("stable_kernels", "atomic") if kernels else ("atomic",))
    )
    for i, row in enumerate(rows, 1):
        # a one-kernel row's tile with each one-kernel variant (they share the tile vocabulary)
        variants = (row.plan.variant,) if row.plan.variant == "two_kernel" else ONE_KERNEL
        for variant in variants:
            for align in ("lists",) if variant == "gluon_routed" else aligned:
                key = (variant, tuple(sorted(row.plan.tile.items())), align)
                plan = Plan(
                    variant=variant,
                    tile=dict(row.plan.tile),
                    align=align,
                    why=f"candidate: the tile of {source}, row {i}, with {variant} and align {align}",
                )
                if key in seen or variant_reason(launch_of(plan), problem, device) is not None:
                    continue
                seen.add(key)
                out.append(plan)
    return out
