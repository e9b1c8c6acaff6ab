"""Small validation helpers shared by the op contracts; each raises with the argument's name."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from magi2_core import config
from magi2_core.errors import InvalidDeviceError, InvalidDTypeError, InvalidShapeError, InvalidValueError

__all__ = [
    "describe",
    "device_fields",
    "device_value_checks",
    "nan_free_parameter",
    "any_tensor",
    "real",
    "with_data",
    "dtype_in",
    "dtype_name",
    "rank",
    "replace_device_value_checks",
    "same_device",
    "tensor",
    "FLOATS",
    "gather_index",
    "head_activations",
    "modality_sizes",
    "out_dtype",
]

# The activation dtypes every op takes.
FLOATS = (torch.bfloat16, torch.float16, torch.float32)

# Checks of values that live on an accelerator (expert ids in range, device prefix sums) need a host
# sync, which a serving loop (and CUDA-graph capture) cannot afford, so they are opt-in there:
# MAGI2_CHECK_DEVICE_VALUES=1 or set_device_value_checks(True). Host values are always checked.
# None: follow the configuration; a bool: set at run time (wins until set back to None).
_DEVICE_VALUES: bool | None = None


def device_value_checks() -> bool:
    return bool(config.get("MAGI2_CHECK_DEVICE_VALUES")) if _DEVICE_VALUES is None else _DEVICE_VALUES


def replace_device_value_checks(enabled: bool | None) -> bool | None:
    """Set the checks of device-resident values (``None``: follow ``MAGI2_CHECK_DEVICE_VALUES``) and return
    the previous setting: what :func:`magi2_core.set_device_value_checks` does besides clearing the ops'
    cached call layouts."""
    global _DEVICE_VALUES
    if enabled is not None and not isinstance(enabled, bool):
        raise InvalidValueError("set_device_value_checks", "enabled", "True, False or None", repr(enabled))
    previous, _DEVICE_VALUES = _DEVICE_VALUES, enabled
    return previous


def device_fields(device: torch.device | str) -> tuple[str, int | None]:
    """``(device_type, device_index)`` of a raw key's device (a ``torch.device``, or a type name)."""
    if isinstance(device, str):
        return device, None
    return device.type, device.index


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (memoised: this runs on every op call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def describe(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)} tensor of shape {list(t.shape)} on {t.device}"


def tensor(op: str, arg: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidDTypeError(op, arg, "a torch.Tensor", type(value).__name__)
    return value


def with_data(op: str, arg: str, t: torch.Tensor) -> None:
    """The op's leading tensor must hold data (the others must share its device)."""
    if t.is_meta:
        raise InvalidDeviceError(
            op, arg, "a tensor with data (a meta tensor has none; no kernel can run on it)", describe(t)
        )


def nan_free_parameter(op: str, arg: str, t: torch.Tensor) -> None:
    """Reject NaN in a parameter tensor (sinks, router bias) where that costs no device sync: on the host
    always, on an accelerator only with device value checks on. ``±inf`` are values with a meaning, as
    upstream defines them (a ``-inf`` sink adds nothing, a ``+inf`` one takes all the mass; a ``-inf``
    bias ranks its expert last), so they pass; a NaN has none (a NaN sink would silently zero its head,
    a NaN bias would pick arbitrary experts).

    Called on every call with a host parameter, cached call layout or not: a version counter cannot
    say whether the values changed (``.data.copy_``, ``.data =`` and numpy writes leave it alone), and
    the check costs about 2 µs on a host tensor of the sizes these parameters have (one ``max``,
    which is NaN exactly when a value is; ``isnan().any()`` takes twice as long). Host parameters
    come only with host inputs (they must share the inputs' device), so GPU calls never pay it."""
    if t.numel() and (t.is_cpu or device_value_checks()) and math.isnan(t.max().item()):
        bad = int(torch.isnan(t).sum())
        raise InvalidValueError(
            op, arg, "values without NaN (±inf are allowed; it is a learned parameter)", f"{bad} NaN of {t.numel()}"
        )


def any_tensor(*values: object) -> bool:
    """Whether a scalar argument came as a tensor (it hashes by identity and may change in place, so a
    call layout holding it is never cached)."""
    return any(isinstance(v, torch.Tensor) for v in values)


def real(op: str, arg: str, value: object, expected: str) -> float:
    """``value`` as a Python float: ints, floats, numpy scalars and 0-d tensors; never text, bool or None."""
    if type(value) is float:  # the common case, first
        return value
    if value is None or isinstance(value, (str, bytes, bool)):
        raise InvalidValueError(op, arg, expected, repr(value))
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor with more than one element
        raise InvalidValueError(op, arg, expected, repr(value)) from None


def float_input(op: str, arg: str, value: object) -> torch.Tensor:
    """An op's main input: a tensor with data (not meta), of a float dtype the ops serve."""
    t = tensor(op, arg, value)
    with_data(op, arg, t)
    dtype_in(op, arg, t, FLOATS)
    return t


def rows_3d(op: str, arg: str, t: torch.Tensor, layout: str, min_last: int = 1) -> tuple[int, int, int]:
    """``t``'s ``[T, A, B]`` sizes, with ``A >= 1`` and ``B >= min_last`` (``layout`` says so to the user)."""
    if t.dim() != 3 or t.shape[1] < 1 or t.shape[2] < min_last:
        raise InvalidShapeError(op, arg, layout, describe(t))
    a, b, c = t.shape
    return a, b, c


def non_negative(op: str, arg: str, value: object) -> float:
    """``value`` as a finite Python float >= 0 (an eps: 0 is allowed, an all-zero row then gives 0/0)."""
    v = real(op, arg, value, "a finite float >= 0")
    if not math.isfinite(v) or v < 0:
        raise InvalidValueError(op, arg, "a finite float >= 0", repr(value))
    return v


def rank(op: str, arg: str, t: torch.Tensor, ranks: Iterable[int], layout: str) -> None:
    allowed = tuple(ranks)
    if t.dim() not in allowed:
        raise InvalidShapeError(op, arg, f"{' or '.join(map(str, allowed))}-D {layout}", describe(t))


def dtype_in(op: str, arg: str, t: torch.Tensor, dtypes: Iterable[torch.dtype]) -> None:
    allowed = tuple(dtypes)
    if t.dtype not in allowed:
        raise InvalidDTypeError(op, arg, "of dtype " + " or ".join(dtype_name(d) for d in allowed), describe(t))


def head_activations(op: str, arg: str, value: object) -> torch.Tensor:
    """The MoE ops' activations: a floating ``[tokens, heads, hidden]`` tensor with data."""
    x = tensor(op, arg, value)
    with_data(op, arg, x)
    rank(op, arg, x, (3,), "[tokens, heads, hidden]")
    dtype_in(op, arg, x, FLOATS)
    return x


def same_device(op: str, ref_arg: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for arg, t in others.items():
        if t is not None and t.device != ref.device:
            raise InvalidDeviceError(op, arg, f"on {ref.device} like '{ref_arg}'", describe(t))


def modality_sizes(op: str, value: object, tokens: int, tokens_of: str) -> tuple[int, ...] | None:
    """Host-side modality group sizes (non-negative ints summing to ``tokens``, the size ``tokens_of`` names)
    as a tuple; None stays None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        raise InvalidShapeError(
            op, "modality_sizes", "a host-side list of ints (not a tensor: no device sync)", describe(value)
        )
    if not isinstance(value, Sequence):
        raise InvalidShapeError(op, "modality_sizes", "a list of ints or None", type(value).__name__)
    sizes = tuple(value)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
        raise InvalidShapeError(op, "modality_sizes", "a non-empty list of non-negative ints", repr(value))
    if sum(sizes) != tokens:
        raise InvalidShapeError(
            op,
            "modality_sizes",
            f"sizes summing to the token count {tokens_of} = {tokens}",
            f"{list(sizes)} (sum {sum(sizes)})",
        )
    return sizes


def out_dtype(op: str, value: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """An op's output dtype: ``default`` (its input's) for None, else one of :data:`FLOATS`."""
    od = default if value is None else value
    if od not in FLOATS:
        raise InvalidDTypeError(op, "out_dtype", "None, torch.float32, torch.bfloat16 or torch.float16", repr(value))
    return od


def gather_index(op: str, value: object, tokens: int) -> torch.Tensor | None:
    """A row gather's ``index``: None, or an int32/int64 ``[tokens]`` tensor (its values are not read on the
    host, which would synchronise with a device)."""
    if value is None:
        return None
    idx = tensor(op, "index", value)
    if idx.dtype not in (torch.int32, torch.int64):
        raise InvalidDTypeError(op, "index", "torch.int32 or torch.int64", describe(idx))
    if tuple(idx.shape) != (tokens,):
        raise InvalidShapeError(op, "index", f"[{tokens}] (one source row per output row)", describe(idx))
    return idx
