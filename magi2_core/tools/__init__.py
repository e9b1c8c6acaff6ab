"""The tools behind ``magi2`` commands that are not the library's call path.

The demo layer (:mod:`.demo`), the environment report (:mod:`.report`), the dispatch-overhead
measurement (:mod:`.overhead`) and the timing harness shared with ``magi2 tune`` and the benchmarks
(:mod:`.timing`).
"""
