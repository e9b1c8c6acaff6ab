"""An op's eager cache lookup, generated from its declared arguments (:mod:`magi2_core.ops._args`).

A repeated call layout (everything validation looks at, except tensors' identities) finds its validated
call and resolved kernel in the dispatcher's cache. The lookup is generated once per op as plain code:
the key is one tuple display of each argument's ``layout`` template, as a hand-written lookup would be,
so that the hot path pays for no loop over the declaration and no call but the lookup's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from magi2_core.contracts._checks import device_value_checks
from magi2_core.ops._spec import OpSpec
from magi2_core.selection.dispatch import dispatcher
from magi2_core.selection.overrides import context_token

__all__ = ["Layout", "cache_lookup", "keep_scalars"]


class Layout(NamedTuple):
    """What a repeated call layout reuses, for an op that keeps nothing but its kernel and scalar fields."""

    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)


def keep_scalars(tensors: int) -> Callable[[Any, str, Any, tuple[Any, ...]], Layout]:
    """The ``make`` of :func:`cache_lookup` for such an op, whose call record leads with ``tensors`` tensors."""

    def make(kernel: Any, name: str, call: Any, args: tuple[Any, ...]) -> Layout:
        return Layout(kernel, name, call[tensors:])

    return make


def cache_lookup(
    spec: OpSpec[Any, Any],
    make: Callable[[Any, str, Any, tuple[Any, ...]], Any],
    *,
    value_checked: bool = False,
    recheck: tuple[str, Callable[[Any, Any], None]] | None = None,
) -> Callable[..., Any]:
    """``bind(args, provider)``: what a public call with ``spec``'s declared arguments ``args`` (a tuple, in
    declaration order) reuses of its call layout, found in the dispatcher's cache, or made and kept.

    On a miss: the spec's validation (which raises on a bad argument), the kernel resolved for it, and
    ``make(kernel, provider_name, call, args)``, kept where the layout may be (:meth:`Args.cacheable`; and,
    when ``value_checked``, not while device value checks are on: every call is then checked in full).
    ``recheck`` ``(name, check)``: on a hit whose ``recheck`` field is set, ``check(hit, <argument name>)``
    (a host tensor's values, checked on every call).
    """
    declared, validate = spec.args, spec.validator
    names = ", ".join(declared.names)
    items = ", ".join(a.layout.replace("{}", a.name) for a in declared.rows)
    lines = [
        "def bind(args, provider):",
        f"    {names}, = args",
        "    d = dispatcher()",
        "    cache = d.bound_calls()",
        "    try:",
        f"        layout = ({declared.op!r}, provider, context_token(), {items})",
        "        hit = cache.get(layout)",
        "    except (AttributeError, TypeError, RuntimeError, NotImplementedError):  # validation says what",
        "        layout = hit = None",
        "    if hit is None:",
        "        return miss(d, cache, layout, args, provider)",
    ]
    if recheck is not None:
        lines += ["    if hit.recheck:", f"        recheck(hit, {recheck[0]})"]
    lines.append("    return hit")

    def miss(
        d: Any,
        cache: dict[tuple[Any, ...], Any],
        layout: tuple[Any, ...] | None,
        args: tuple[Any, ...],
        provider: str | None,
    ) -> Any:
        call = declared.call(validate, args, compiling=False)
        kernel, name = d.kernel(spec, call.key, provider)
        hit = make(kernel, name, call, args)
        if layout is not None and declared.cacheable(args) and not (value_checked and device_value_checks()):
            if len(cache) >= d.BOUND_LIMIT:
                cache.clear()
            cache[layout] = hit
        return hit

    namespace: dict[str, Any] = {
        "__name__": f"magi2_core.ops.{declared.op}",
        "dispatcher": dispatcher,
        "context_token": context_token,
        "miss": miss,
        "recheck": recheck and recheck[1],
    }
    exec(compile("\n".join(lines) + "\n", f"<magi2_core.ops.{declared.op} bind>", "exec"), namespace)
    fn: Callable[..., Any] = namespace["bind"]
    return fn
