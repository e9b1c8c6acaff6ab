"""Small validation helpers shared by the op contracts; each raises with the argument's name."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from magi2_core.errors import InvalidDeviceError, InvalidDTypeError, InvalidShapeError

__all__ = ["describe", "dtype_in", "dtype_name", "rank", "same_device", "tensor"]


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


def rank(op: str, arg: str, t: torch.Tensor, ranks: Iterable[int], layout: str) -> None:
    allowed = tuple(ranks)
    if t.dim() not in allowed:
        raise InvalidShapeError(op, arg, f"{' or '.join(map(str, allowed))}-D {layout}", describe(t))


def dtype_in(op: str, arg: str, t: torch.Tensor, dtypes: Iterable[torch.dtype]) -> None:
    allowed = tuple(dtypes)
    if t.dtype not in allowed:
        raise InvalidDTypeError(op, arg, "of dtype " + " or ".join(dtype_name(d) for d in allowed), describe(t))


def same_device(op: str, ref_arg: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for arg, t in others.items():
        if t is not None and t.device != ref.device:
            raise InvalidDeviceError(op, arg, f"on {ref.device} like '{ref_arg}'", describe(t))
