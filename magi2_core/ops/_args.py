"""An operator's arguments, declared once: what the op module's plumbing is derived from.

Each op module declares its public function's arguments (without ``provider``) as an :class:`Args` of
:class:`Arg` rows, in the function's order. From that one declaration come:

- the ``torch.library`` custom op (its schema, the body that validates and runs when a compiled graph
  executes, the fake), :func:`magi2_core.ops._compiled.custom_op`, and the compiled call of the public
  function, :meth:`Args.compiled`;
- the cache lookup of the public call (:func:`magi2_core.ops._lookup.cache_lookup`: the call-layout key a
  repeated call is found by, from each row's ``layout`` template; the lookup and, on a miss, validation and
  resolution) and whether a layout may be kept (:meth:`Args.cacheable`);
- the spec's ``validate_arguments`` (defaults and resolution of ``None``), :meth:`Args.validate_arguments`;
- the feature mask of a validated call, :meth:`Args.features`;
- the docstring's ``Args:`` section, and the check that the public function's explicit, typed signature
  says what the declaration says (:meth:`Args.public`, at import; ``tests/test_op_args.py``).

The public function keeps its written signature (IDEs and type checkers read it) and what it does with a
found layout; validation stays in the op's ``validate`` (a public, typed function backends call).
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from magi2_core import config
from magi2_core.model.problem import FEATURE_BIT, Feature

__all__ = [
    "INTS",
    "OPTIONAL_TENSOR",
    "REQUIRED",
    "SCALAR",
    "TENSOR",
    "VALUE",
    "Arg",
    "Args",
    "Pack",
    "deterministic_arg",
    "eps_arg",
    "index_arg",
    "modality_sizes_arg",
    "out_dtype_arg",
    "record",
]

F = TypeVar("F", bound=Callable[..., Any])
REQUIRED: Any = inspect.Parameter.empty  # an argument without a default (positional in the public function)

# How an argument enters the call-layout key: an expression of the argument, written ``{}`` (a template
# may also name the op's other arguments, and names bound by an earlier one with ``:=``). Everything
# validation looks at, except tensors' identities.
TENSOR = "{}.shape, {}.dtype, {}.device"
OPTIONAL_TENSOR = "None if {} is None else ({}.shape, {}.dtype, {}.device)"
VALUE = "{}"  # a flag or a name: equal values validate alike
SCALAR = "{}, type({})"  # a number: 1 and 1.0 and True validate differently; a tensor is never kept
INTS = "None if {} is None else (type({}), *{})"  # host ints by value; a non-int entry is never kept


@dataclass(frozen=True)
class Arg:
    """One argument of an op's public function."""

    name: str
    annotation: str  # the public function's annotation, as its source spells it
    doc: str  # its line in the docstring's Args section ("": it shares the line of the argument above)
    default: Any = REQUIRED
    schema: Any = None  # the custom op's Python type (torch infers the schema from it); None: not passed
    to_schema: Callable[[Any], Any] | None = None  # converts the value for the custom op (a list for a tuple)
    compiled: Any = None  # what validation receives under torch.compile for an argument not passed
    layout: str = SCALAR  # its items in the call-layout key (one of the templates above, or the op's own)
    feature: Feature | None = None  # asked for when the validated value is set (not None, not false or zero)
    resolve: Callable[[Any], Any] | None = None  # what ``None`` means, resolved before validation
    positional: bool = False  # positional or keyword although it has a default (else keyword-only)


record = tuple.__new__  # builds a call record (a NamedTuple) from a tuple without its Python __new__: the hot path


# Rows that several ops declare alike (each op gives its own docstring line).
def _int_list(sizes: Sequence[int] | None) -> list[int] | None:
    return None if sizes is None else list(sizes)


def eps_arg(doc: str, default: float) -> Arg:
    """A norm's ``eps: float``."""
    return Arg("eps", "float", doc, default, schema=float, to_schema=float)


def modality_sizes_arg(doc: str) -> Arg:
    """``modality_sizes: Sequence[int] | None``: host-side ints, keyed by value; a list for the custom op."""
    return Arg(
        "modality_sizes", "Sequence[int] | None", doc, None, schema=list[int] | None, to_schema=_int_list, layout=INTS
    )


def index_arg(upstream: str) -> Arg:
    """``index: torch.Tensor | None``: an optional row gather on x's device (``upstream``: vllm-omni's name for it)."""
    doc = (
        f"``[T]`` int32 or int64 on x's device: output row t reads x's row ``index[t]`` (vllm-omni's ``{upstream}``); "
        "values in [0, T), not checked on the host (that would sync). None: row t."
    )
    return Arg("index", "torch.Tensor | None", doc, None, schema=torch.Tensor | None, layout=OPTIONAL_TENSOR)


def _deterministic(value: bool | None) -> bool:
    return config.get("MAGI2_DETERMINISTIC") if value is None else value


def deterministic_arg() -> Arg:
    """``deterministic: bool | None``: the feature, ``None`` meaning ``MAGI2_DETERMINISTIC``."""
    return Arg(
        "deterministic",
        "bool | None",
        "ask for a bit-reproducible provider (None: ``MAGI2_DETERMINISTIC``).",
        None,
        schema=bool,
        layout=VALUE,
        feature=Feature.DETERMINISTIC,
        resolve=_deterministic,
    )


def out_dtype_arg(doc: str = "the output dtype (None: x's dtype).") -> Arg:
    """``out_dtype: torch.dtype | None``."""
    return Arg("out_dtype", "torch.dtype | None", doc, None, schema=torch.dtype | None, layout=VALUE)


@dataclass(frozen=True)
class Pack:
    """Consecutive public arguments that reach the custom op as other parameters (``moe_experts``: its three
    weights, or one prepared-weights object in their place, travel as a tensor list and its layout name)."""

    names: tuple[str, ...]  # the public arguments, consecutive in the declaration
    params: tuple[tuple[str, Any], ...]  # the custom op's parameters in their place: (name, Python type)
    pack: Callable[..., tuple[Any, ...]]  # the public values -> the parameters' values
    unpack: Callable[..., tuple[Any, ...]]  # the parameters' values -> the values validation receives


@dataclass(frozen=True)
class Args:
    """The arguments of one op's public function, in its order, and what is derived from them."""

    op: str
    rows: tuple[Arg, ...]
    pack: Pack | None = None
    names: tuple[str, ...] = field(init=False)
    positional: tuple[str, ...] = field(init=False)  # the leading positional arguments

    def __post_init__(self) -> None:
        names = tuple(a.name for a in self.rows)
        positional = tuple(a.name for a in self.rows if a.default is REQUIRED or a.positional)
        if names[: len(positional)] != positional:
            raise TypeError(f"{self.op}: the positional arguments must come first, got {names}")
        if self.pack is not None and self.pack.names not in {
            names[i : i + len(self.pack.names)] for i in range(len(names))
        }:
            raise TypeError(f"{self.op}: packed arguments {self.pack.names} are not consecutive in {names}")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "positional", positional)

    # -- validation ------------------------------------------------------------------------------
    def call(self, validate: Callable[..., Any], args: Sequence[Any], **extra: Any) -> Any:
        """``validate`` called with the public function's arguments ``args`` (in declaration order)."""
        n = len(self.positional)
        return validate(*args[:n], **dict(zip(self.names[n:], args[n:], strict=True)), **extra)

    def validate_arguments(self, validate: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``validate`` of the public function's own arguments (without ``provider``): defaults filled in,
        ``None`` resolved and packed arguments normalised as the public function does; an unknown keyword or
        a missing argument reaches ``validate`` (which raises ``TypeError``)."""
        kw = dict(kwargs)
        for a in self.rows[len(args) :]:
            if a.default is not REQUIRED or a.name in kw:
                value = kw.pop(a.name, a.default)
                kw[a.name] = a.resolve(value) if a.resolve is not None and value is None else value
        if self.pack is not None and len(args) <= len(self.positional):
            named = {**dict(zip(self.names, args, strict=False)), **kw}
            given = [named.get(n) for n in self.pack.names]
            named.update(zip(self.pack.names, self.pack.unpack(*self.pack.pack(*given)), strict=True))
            args = tuple(named.pop(n) for n in self.names[: len(args)])
            kw = named
        return validate(*args, **kw, compiling=False)

    def features(self, call: Any, compiling: bool) -> int:
        """The feature mask the declared feature arguments of a validated ``call`` ask for."""
        mask = FEATURE_BIT[Feature.COMPILING] if compiling else 0
        for a in self.rows:
            if a.feature is not None:
                value = getattr(call, a.name)
                if value is not None and (isinstance(value, torch.Tensor) or value):
                    mask |= FEATURE_BIT[a.feature]
        return mask

    # -- the call-layout cache -----------------------------------------------------------------
    def cacheable(self, args: Sequence[Any]) -> bool:
        """Whether a layout may be kept: a number given as a tensor hashes by identity and could change in
        place, and host ints other than plain ints must meet validation every time."""
        for a, value in zip(self.rows, args, strict=True):
            if a.layout == SCALAR and isinstance(value, torch.Tensor):
                return False
            if a.layout == INTS and value is not None and not all(type(s) is int for s in value):
                return False
        return True

    def _schema_rows(self) -> list[tuple[str, Any]]:
        """The custom op's parameters before ``provider``: (name, Python type)."""
        out: list[tuple[str, Any]] = []
        for a in self.rows:
            if self.pack is not None and a.name in self.pack.names:
                if a.name == self.pack.names[0]:
                    out.extend(self.pack.params)
            elif a.schema is not None:
                out.append((a.name, a.schema))
        return out

    def schema_signature(self, returns: Any) -> inspect.Signature:
        """The custom op's Python signature (torch infers its schema from it): the arguments it is passed,
        then ``provider``."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [inspect.Parameter(name, kind, annotation=t) for name, t in self._schema_rows()]
            + [inspect.Parameter("provider", kind, annotation=str | None)],
            return_annotation=returns,
        )

    def from_schema(self, given: Sequence[Any]) -> tuple[list[Any], Any]:
        """The public arguments (in declaration order, packed ones unpacked) and ``provider`` of a custom-op
        call: an argument the custom op is not passed takes its ``compiled`` value."""
        values = iter(given)
        args: list[Any] = []
        for a in self.rows:
            if self.pack is not None and a.name in self.pack.names:
                if a.name == self.pack.names[0]:
                    args.extend(self.pack.unpack(*(next(values) for _ in self.pack.params)))
            else:
                args.append(next(values) if a.schema is not None else a.compiled)
        return args, next(values)

    # -- torch.compile ---------------------------------------------------------------------------
    def compiled(self, args: Sequence[Any], provider: str | None) -> Any:
        """The public call recorded as the op's custom op (``torch.ops.magi2.<op>``)."""
        given: list[Any] = []
        for i, (a, v) in enumerate(zip(self.rows, args, strict=True)):
            if self.pack is not None and a.name in self.pack.names:
                if a.name == self.pack.names[0]:
                    given.extend(self.pack.pack(*args[i : i + len(self.pack.names)]))
            elif a.schema is not None:
                given.append(a.to_schema(v) if a.to_schema is not None else v)
        return getattr(torch.ops.magi2, self.op)(*given, provider)

    # -- the public function ---------------------------------------------------------------------
    def signature_errors(self, fn: Callable[..., Any]) -> list[str]:
        """How ``fn``'s written signature differs from the declaration (empty: they agree)."""
        params = list(inspect.signature(fn).parameters.values())
        errors: list[str] = []
        if not params or params[-1].name != "provider" or params[-1].default is not None:
            errors.append("the last parameter must be `provider: str | None = None`")
        else:
            params = params[:-1]
        got = [p.name for p in params]
        if got != list(self.names):
            errors.append(f"parameters {got} are not the declared {list(self.names)}")
            return errors
        for a, p in zip(self.rows, params, strict=True):
            kind = p.POSITIONAL_OR_KEYWORD if a.name in self.positional else p.KEYWORD_ONLY
            if p.kind != kind:
                errors.append(f"{a.name}: {p.kind.description}, declared {kind.description}")
            if p.default is not a.default and p.default != a.default:
                errors.append(f"{a.name}: default {p.default!r}, declared {a.default!r}")
            if p.annotation != a.annotation:
                errors.append(f"{a.name}: annotation {p.annotation!r}, declared {a.annotation!r}")
        return errors

    def docs(self) -> str:
        """The docstring's ``Args:`` section (Google style), one entry per declared line."""
        entries: list[list[str]] = []  # [names..., doc]: an undocumented argument joins the entry above
        for a in (*self.rows, Arg("provider", "str | None", "force a provider by name (see ``m2.use`` for a scope).")):
            if a.doc:
                entries.append([a.name, a.doc])
            else:
                entries[-1].insert(-1, a.name)
        lines: list[str] = []
        for *names, doc in entries:
            lines.extend(textwrap.wrap(f"{', '.join(names)}: {doc}", 104, subsequent_indent="    "))
        return "Args:\n" + textwrap.indent("\n".join(lines), "    ") + "\n"

    def public(self, fn: F) -> F:
        """Check ``fn``'s signature against the declaration and write the ``Args:`` section into its
        docstring (before its ``Returns:``); raise ``TypeError`` naming each difference."""
        errors = self.signature_errors(fn)
        if errors:
            raise TypeError(
                f"magi2_core.ops.{self.op}.{fn.__name__} disagrees with its declared arguments: " + "; ".join(errors)
            )
        doc = inspect.cleandoc(fn.__doc__ or "")
        head, sep, tail = doc.partition("Returns:")
        fn.__doc__ = f"{head.rstrip()}\n\n{self.docs()}\n{sep}{tail}" if sep else f"{doc}\n\n{self.docs()}"
        return fn
