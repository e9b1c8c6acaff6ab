"""Is this process on MUSA, and bring up the MUSA runtime (torchada first) when it is.

Two traps shape this module:

* torchada makes MUSA tensors report ``is_cuda=True`` (while ``torch.cuda.is_available()`` stays
  False). The platform therefore never comes from ``is_cuda``: a call's device is
  ``tensor.device.type``, which is ``"musa"`` for a MUSA tensor (torch_musa renames the
  PrivateUse1 backend), and the core builds its problem from exactly that.
* ``import torchada`` has side effects even on a CPU or CUDA machine (it sets
  ``SGLANG_MOE_CONFIG_DIR`` and ``VLLM_TUNED_CONFIG_FOLDER``), so it is imported only after MUSA
  has been detected, and detection itself imports nothing: it reads ``torch.version.musa`` and
  asks the import system whether ``torch_musa`` *could* be imported.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from magi2_core.backend import musa_installed

__all__ = ["DEVICE_TYPE", "import_musa_runtime", "musa_installed"]

DEVICE_TYPE = "musa"


def import_musa_runtime() -> ModuleType:
    """Import torchada, then torch_musa; return torchada.

    Must run before MATE is imported, so that MATE and everything after it see the patched torch.
    torchada comes first because it is written to be the first import (it syncs the visible-device
    variables and patches ``torch.cuda`` itself); torch_musa is then imported by name because
    torchada *tolerates* its absence, and a missing torch_musa must surface here as an ImportError
    rather than later as a confusing MATE failure. Raises :class:`RuntimeError` off MUSA, where
    importing torchada would only change the environment.
    """
    if not musa_installed():
        raise RuntimeError("not a MUSA platform (no torch.version.musa, no torch_musa): torchada is not imported")
    torchada = importlib.import_module("torchada")
    importlib.import_module("torch_musa")
    return torchada
