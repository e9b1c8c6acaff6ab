"""Small validation helpers shared by the op contracts; each raises with the argument's name."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

from magi2_core import config
from magi2_core.errors import InvalidDeviceError, InvalidDTypeError, InvalidShapeError, InvalidValueError

__all__ = [
    "describe", "device_fields", "device_value_checks", "finite_parameter", "finite_parameter_once", "any_tensor", "checked_finite", "real", "with_data", "dtype_in", "dtype_name", "rank", "same_device", "set_device_value_checks",
    "tensor", "FLOATS", "head_activations",
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


def set_device_value_checks(enabled: bool | None) -> bool | None:
    """Turn host-syncing checks of device-resident values on or off (``None``: follow
    ``MAGI2_CHECK_DEVICE_VALUES``); returns the previous setting, which restores it when passed back."""
    global _DEVICE_VALUES
    if enabled is not None and not isinstance(enabled, bool):
        raise InvalidValueError("set_device_value_checks", "enabled", "True, False or None", repr(enabled))
    previous, _DEVICE_VALUES = _DEVICE_VALUES, enabled
    from magi2_core.ops import dispatcher  # the ops' cached call layouts were validated under the old setting

    dispatcher().clear()
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
        raise InvalidDeviceError(op, arg, "a tensor with data (a meta tensor has none; no kernel can run on it)",
                                 describe(t))


def finite_parameter(op: str, arg: str, t: torch.Tensor) -> None:
    """Reject NaN/inf in a parameter tensor (sinks, router bias) where that costs no device sync: on the
    host always, on an accelerator only with device value checks on (a non-finite sink would silently
    zero a head's output, a NaN bias would pick arbitrary experts)."""
    if t.numel() and (t.device.type == "cpu" or device_value_checks()) and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise InvalidValueError(op, arg, "finite values (it is a learned parameter)", f"{bad} NaN/inf of {t.numel()}")


FiniteMemo = list[tuple["weakref.ref[torch.Tensor]", int] | None]


def finite_parameter_once(op: str, arg: str, t: torch.Tensor, memo: FiniteMemo) -> None:
    """:func:`finite_parameter`, skipped while ``t`` is the tensor last found finite and unchanged since
    (same object, same version counter): a parameter is checked once, not on every call. ``memo`` is a
    one-slot list owned by the caller's cache entry."""
    last = memo[0]
    try:
        version = t._version
    except RuntimeError:  # an inference-mode tensor has no version counter: check it every time
        finite_parameter(op, arg, t)
        return
    if last is not None and last[0]() is t and last[1] == version:
        return
    finite_parameter(op, arg, t)
    memo[0] = (weakref.ref(t), version)


def any_tensor(*values: object) -> bool:
    """Whether a scalar argument came as a tensor (it hashes by identity and may change in place, so a
    call layout holding it is never cached)."""
    return any(isinstance(v, torch.Tensor) for v in values)


def checked_finite(t: torch.Tensor | None) -> FiniteMemo:
    """A memo for :func:`finite_parameter_once` recording that ``t`` was just found finite."""
    try:
        return [None if t is None else (weakref.ref(t), t._version)]
    except RuntimeError:  # an inference-mode tensor has no version counter
        return [None]


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
