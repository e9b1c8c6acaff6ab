"""Selection: which provider serves a call, and how the choice is kept, overridden and checked.

The registry of installed backends (:mod:`.registry`), the resolver that judges every provider for a
problem and explains its choice (:mod:`.resolver`), the dispatcher's per-device cache (:mod:`.dispatch`),
scoped overrides (:mod:`.overrides`), strict mode (:mod:`.strict`) and shadow verification against the
reference (:mod:`.shadow`). Device profiles, which this layer reads, are :mod:`magi2_core.profiles`.
"""
