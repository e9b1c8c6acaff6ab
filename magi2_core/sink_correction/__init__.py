"""Learned-sink corrections: the core's own math (:mod:`~magi2_core.sink_correction.reference`) and which
correction a device type gets (:mod:`~magi2_core.sink_correction.choice`), one name for the concept.

The package imports nothing itself: the math sits with the contracts, the choice above the registry.
"""
