"""``magi2 tune``: measure every eligible provider (and plan) over a grid, write a device profile.

- :mod:`~magi2_core.tuning.grid`: the default production grid and ``--shapes FILE``;
- :mod:`~magi2_core.tuning.measure`: one point, every eligible provider and plan, through the one
  harness (:mod:`magi2_core.tools.timing`);
- :mod:`~magi2_core.tuning.regions`: winners to profile rows (geometric-mean cuts, upper bounds);
- :mod:`~magi2_core.tuning.write`: the profile file, with provenance;
- :mod:`~magi2_core.tuning.session`: resumable runs (``<out>.partial``);
- :mod:`~magi2_core.tuning.run`: :func:`tune`, all of it. Described in ``docs/tuning.md``.
"""

from magi2_core.tuning.run import TuneRun, device_key, tune

__all__ = ["TuneRun", "device_key", "tune"]
