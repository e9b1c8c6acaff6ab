"""Which magi2 Python frames a call passes through: for tests that bound the dispatch depth."""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Callable

__all__ = ["magi2_frames_at"]


def magi2_frames_at(call: Callable[[], object], launch: types.CodeType) -> tuple[list[list[str]], Counter[str]]:
    """Run ``call`` under ``sys.setprofile``; return the magi2 frames on the stack (innermost first) each
    time the function with code ``launch`` starts, and how often each magi2 function was entered."""
    stacks: list[list[str]] = []
    entered: Counter[str] = Counter()
    here = sys._getframe()  # the walk stops at this frame: the caller's own frames are not counted

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if name.startswith("magi2"):
            entered[f"{name}.{frame.f_code.co_name}"] += 1
        if frame.f_code is launch:
            chain, f = [], frame.f_back
            while f is not None and f is not here:
                module = f.f_globals.get("__name__", "")
                if module.startswith("magi2"):
                    chain.append(f"{module}.{f.f_code.co_name}")
                f = f.f_back
            stacks.append(chain)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return stacks, entered
