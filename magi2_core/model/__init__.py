"""The data model: what a call, a backend and a device are.

The typed problem a call is judged by (:mod:`.problem`), a provider's capability descriptor and its
rules (:mod:`.capability`), a backend's spec (:mod:`.backend_spec`), the kernel protocols a provider may
implement (:mod:`.kernel`), a kernel plan (:mod:`.plan`), devices present (:mod:`.devices`) and described
(:mod:`.virtual_device`). Nothing here chooses anything: selection is :mod:`magi2_core.selection`.
"""
