"""A deliberately wrong example backend: the conformance kit and shadow verification must catch it.

Registered in process by the tests (``get_registry().register(bad_provider.plugin, name=...)``);
never installed. Each provider carries one realistic bug:

* ``bad_attention`` forgets the learned sinks and returns the LSE as ``[Tq, Hq]`` (the FA2 layout)
  instead of the contract's ``[Hq, Tq]``;
* ``bad_rmsnorm`` scales every token with the first modality's weights (ignores ``modality_sizes``);
* ``overclaim_attention`` is correct but its descriptor claims float16 while ``check()`` refuses it.
"""
