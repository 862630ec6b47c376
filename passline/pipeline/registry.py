"""The pass registry: passes are declared once, with their options and the facts they need and give.

    @passline.register_pass("drop_casts", requires={"lowered"})
    def drop_casts(graph, ctx, *, keep_outputs: bool = True):
        '''Remove casts to the same dtype.'''
        ...

Options are the pass's keyword-only parameters (type from the annotation or the default; a doc from
`Annotated[int, "doc"]`, a least value from `Annotated[int, "doc", AtLeast(1)]` and the items a comma-separated
str may list from `Annotated[str, "doc", EachOf(...)]`, checked when a pipeline is parsed), or the fields of an
attrs class `Options` on a class-based pass (annotated the same way, or with a doc in `metadata={"doc": ...}`).
Third-party packages register passes through the entry-point group `passline.passes`; those are
imported lazily, the first time a name is looked up that is not registered yet.

Passes live in a `Registry`. The default one holds the built-in passes, yours and installed packages';
`with Registry().active():` scopes registrations and look-ups to a registry of your own (which sees the
default one's passes behind its own).
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import hashlib
import inspect
import re
import typing
from typing import Any, Callable

import attrs

ENTRY_POINT_GROUP = "passline.passes"
OPTION_TYPES = (bool, int, float, str)
# What a pass works on. "scheduler": the SchedulerGraph of one aten graph, after lowering (almost every
# pass). "fx": the torch-level FX graph dynamo captured, before aot_autograd splits it into forward and
# backward — where a rewrite can change what autograd saves (fuse_linear_cross_entropy). FX-stage passes
# run before every scheduler pass, wherever written; the dynamo backend runs them once per captured graph.
STAGES = ("scheduler", "fx")


class PipelineError(ValueError):
    """A bad pipeline: unknown pass, bad option, unmet requirement. `position` is an offset in the text."""

    def __init__(self, message: str, text: str | None = None, position: int | None = None):
        self.text, self.position, self.reason = text, position, message
        if text is not None and position is not None:
            message = f"{message}\n  {text}\n  {' ' * position}^"
        super().__init__(message)


@attrs.frozen
class AtLeast:
    """The least value an int or float option takes (`Annotated[int, "doc", AtLeast(1)]`): a count or a size
    given negative (`split_reductions(splits=-1)`) is an error when the pipeline is parsed, naming the option,
    not inside the pass at compile time."""

    least: float


@attrs.frozen
class EachOf:
    """The items a comma-separated str option may list (`Annotated[str, "doc", EachOf(("sum", "max"))]`): an
    item not among them is an error when the pipeline is parsed, naming the nearest one."""

    choices: tuple


@attrs.frozen
class OptionSpec:
    name: str
    type: type
    default: Any
    doc: str = ""
    choices: tuple | None = None
    least: float | None = None
    items: tuple | None = None  # EachOf: what a comma-separated str option may list

    def coerce(self, value, pass_name: str):
        """The value as this option's type, or a PipelineError saying what is allowed."""
        allowed = f"{self.type.__name__}" + (f" in {list(self.choices)}" if self.choices else "")
        ok = isinstance(value, self.type) and not (self.type is not bool and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise PipelineError(f"option {self.name!r} of pass {pass_name!r} takes {allowed}, got {value!r}")
        if self.choices and value not in self.choices:
            raise PipelineError(f"option {self.name!r} of pass {pass_name!r} takes {allowed}, got {value!r}")
        if self.items is not None:
            listed = [t.strip() for t in value.split(",") if t.strip()]
            wrong = [t for t in listed if t not in self.items]
            if wrong or not listed:
                near = difflib.get_close_matches(wrong[0], self.items, n=1) if wrong else []
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise PipelineError(f"option {self.name!r} of pass {pass_name!r} takes a comma-separated list of "
                                    f"{list(self.items)}, got {value!r}{hint}")
        if self.least is not None and value < self.least:
            raise PipelineError(f"option {self.name!r} of pass {pass_name!r} takes {self.type.__name__} of at least "
                                f"{self.type(self.least)}, got {value!r}")
        return value


@attrs.frozen(eq=False)
class PassInfo:
    """A registered pass. Call it with keyword options to configure it for a Pipeline:
    `fuse(max_nodes=32)`; call it with (graph, ctx) to run it."""

    name: str
    run: Callable  # run(graph, ctx, **options) -> graph | PassResult | None
    options: tuple  # OptionSpec, in declaration order
    requires: frozenset = frozenset()
    provides: frozenset = frozenset()
    invalidates: frozenset = frozenset()
    idempotent: bool = False
    doc: str = ""
    source_of: Any = None  # the function or class whose source keys caches
    stage: str = "scheduler"  # one of STAGES: run(graph, ...) takes a SchedulerGraph, or ("fx") a GraphModule

    @property
    def summary(self) -> str:
        """The doc's first paragraph on one line (its first line alone cut sentences mid-way)."""
        first = re.split(r"\n\s*\n", self.doc.strip())[0]
        return " ".join(line.strip() for line in first.splitlines())

    def option(self, name: str) -> OptionSpec:
        for o in self.options:
            if o.name == name:
                return o
        names = [o.name for o in self.options]
        hint = difflib.get_close_matches(name, names, n=1)
        raise PipelineError(f"pass {self.name!r} has no option {name!r}"
                            + (f"; did you mean {hint[0]!r}?" if hint else "")
                            + (f" (options: {', '.join(names)})" if names else " (it takes no options)"))

    def defaults(self) -> dict:
        return {o.name: o.default for o in self.options}

    def source_hash(self) -> str:
        """Hash of the source of the module defining the pass (one pass per file), so editing the pass
        or a helper beside it changes every cache key that includes it."""
        src = None
        for obj in (inspect.getmodule(self.source_of), self.source_of):
            try:
                src = inspect.getsource(obj)
                break
            except (OSError, TypeError):
                continue
        if src is None:
            src = getattr(self.source_of, "__qualname__", repr(self.source_of))
        return hashlib.sha256(src.encode()).hexdigest()

    def __call__(self, *args, **kwargs):
        if not args:
            from .text import PassCall

            return PassCall.make(self.name, kwargs)
        # run directly, (graph, ctx, **options): the options checked as a pipeline's are (type, choices, AtLeast)
        return self.run(*args, **{k: self.option(k).coerce(v, self.name) for k, v in kwargs.items()})


def _options_from_signature(fn) -> tuple:
    hints = typing.get_type_hints(fn, include_extras=True)
    specs = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"pass option {p.name!r} of {fn.__qualname__} needs a default")
        specs.append(_spec(p.name, hints.get(p.name, type(p.default)), p.default, "", fn))
    return tuple(specs)


def _options_from_attrs(cls) -> tuple:
    hints = typing.get_type_hints(cls, include_extras=True)
    specs = []
    for f in attrs.fields(cls):
        default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
        specs.append(_spec(f.name, hints.get(f.name, f.type or type(default)), default, f.metadata.get("doc", ""), cls))
    return tuple(specs)


def _spec(name: str, hint, default, doc: str, owner) -> OptionSpec:
    """An option from its annotation: a type, `Annotated[type, "doc", AtLeast(n) or EachOf(...)]`, or a Literal."""
    choices = least = items = None
    if typing.get_origin(hint) is typing.Annotated:
        hint, *meta = typing.get_args(hint)
        doc = next((m for m in meta if isinstance(m, str)), doc)
        least = next((m.least for m in meta if isinstance(m, AtLeast)), None)
        items = next((tuple(m.choices) for m in meta if isinstance(m, EachOf)), None)
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        hint = type(choices[0])
    where = f"pass option {name!r} of {getattr(owner, '__qualname__', owner)}"
    if least is not None and default < least:
        raise TypeError(f"{where}: default {default!r} is under its AtLeast({least})")
    if items is not None and not all(t.strip() in items for t in str(default).split(",") if t.strip()):
        raise TypeError(f"{where}: default {default!r} lists an item outside its EachOf({items})")
    return OptionSpec(name, _option_type(hint, owner, name), default, doc, choices, least, items)


def _option_type(hint, owner, name):
    if isinstance(hint, str):
        hint = {t.__name__: t for t in OPTION_TYPES}.get(hint, hint)
    if hint not in OPTION_TYPES:
        raise TypeError(f"option {name!r} of {getattr(owner, '__qualname__', owner)} must be one of "
                        f"bool, int, float, str (got {hint!r})")
    return hint


_INHERIT = object()  # Registry(parent=...) not given: the default registry


class Registry:
    """A set of passes by name. `passline.register_pass` and pipelines use the active registry: the default
    one (built-in passes, yours, and those of installed packages' entry points) unless a
    `with registry.active():` block names another. A registry made with `Registry()` sees the default
    one's passes behind its own (`parent=None`: only its own), so a test or a tool can add and replace
    passes without touching anyone else's."""

    def __init__(self, parent=_INHERIT, *, entry_points: bool = False):
        self.parent: Registry | None = default_registry() if parent is _INHERIT else parent
        self._passes: dict[str, PassInfo] = {}
        self._entry_points_pending = entry_points  # loaded lazily, the first time a name is missing

    # -- registering --------------------------------------------------------------------------------
    def register(self, name: str | None = None, *, requires=(), provides=(), invalidates=(),
                 idempotent: bool = False, replace: bool = False, stage: str = "scheduler"):
        """Decorator: register a pass function `(graph, ctx, **options)`, or a class with an attrs `Options`
        class and a `run(self, graph, ctx, options)` method. Returns the PassInfo (callable like the
        function). `stage="fx"`: the pass takes dynamo's torch.fx.GraphModule instead of a SchedulerGraph
        (see STAGES)."""
        if stage not in STAGES:
            raise ValueError(f"a pass's stage is one of {', '.join(STAGES)}, not {stage!r}")

        def register(obj):
            pname = name or obj.__name__
            if inspect.isclass(obj):
                opts_cls = getattr(obj, "Options", None)
                options = _options_from_attrs(opts_cls) if opts_cls is not None else ()
                instance = obj()

                def run(graph, ctx, **kw):
                    return instance.run(graph, ctx, opts_cls(**kw) if opts_cls is not None else None)
            else:
                options, run = _options_from_signature(obj), obj
            old = self._passes.get(pname)
            if old is not None and not replace and old.source_of is not obj:
                raise ValueError(f"a pass named {pname!r} is already registered "
                                 f"(from {old.source_of.__module__}); pass replace=True to override")
            info = PassInfo(pname, run, options, frozenset(requires), frozenset(provides), frozenset(invalidates),
                            idempotent, inspect.getdoc(obj) or "", obj, stage)
            self._passes[pname] = info
            return info

        return register

    def unregister(self, name: str) -> None:
        self._passes.pop(name, None)

    # -- looking up ---------------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        if not self._entry_points_pending:
            return
        self._entry_points_pending = False
        from importlib.metadata import entry_points

        with self.active():  # their register_pass calls land here, whatever registry is active
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                ep.load()  # importing the module registers its passes

    def find(self, name: str) -> PassInfo | None:
        """The pass called `name` (here, then in the parent), or None."""
        reg = self
        while reg is not None:
            if name not in reg._passes:
                reg._load_entry_points()
            if name in reg._passes:
                return reg._passes[name]
            reg = reg.parent
        return None

    def get(self, name: str) -> PassInfo:
        info = self.find(name)
        if info is None:
            known = list(self.passes())
            hint = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            raise PipelineError(f"unknown pass {name!r}" + (f"; did you mean {' or '.join(map(repr, hint))}?"
                                                            if hint else f" (registered: {', '.join(sorted(known))})"))
        return info

    def passes(self) -> dict[str, PassInfo]:
        """Every pass this registry sees (its own over its parent's), by name."""
        out = self.parent.passes() if self.parent is not None else {}
        self._load_entry_points()
        out.update(self._passes)
        return dict(sorted(out.items()))

    def providers(self, fact: str) -> list[str]:
        return [p.name for p in self.passes().values() if fact in p.provides]

    def catalog_markdown(self) -> str:
        """The passes as a Markdown catalog (docs/passes.md embeds the default registry's; a test keeps it
        current)."""
        lines = []
        for info in self.passes().values():
            facts = []
            for label, group in (("requires", info.requires), ("provides", info.provides),
                                 ("invalidates", info.invalidates)):
                if group:
                    facts.append(f"{label} {', '.join(sorted(group))}")
            lines.append(f"### `{info.name}`\n")
            lines.append(info.summary + "\n")
            if info.stage == "fx":
                lines.append("Stage: fx (dynamo's FX graph, before aot_autograd; runs before the scheduler passes).\n")
            if facts:
                lines.append(f"Facts: {'; '.join(facts)}.\n")
            if info.options:
                lines.append("| option | type | default | meaning |")
                lines.append("|---|---|---|---|")
                for o in info.options:
                    allowed = f" ({' / '.join(map(str, o.choices))})" if o.choices else ""
                    lines.append(f"| `{o.name}` | {o.type.__name__}{allowed} | `{o.default!r}` | {o.doc} |")
                lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    # -- scope --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Within: register_pass, pipelines and pass managers use this registry."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def __repr__(self):
        return f"<Registry {len(self._passes)} passes{' + parent' if self.parent is not None else ''}>"


_DEFAULT = Registry(parent=None, entry_points=True)
_ACTIVE: contextvars.ContextVar[Registry] = contextvars.ContextVar("passline_registry", default=_DEFAULT)


def default_registry() -> Registry:
    """The registry of built-in passes, user passes and installed packages' passes."""
    return _DEFAULT


def current_registry() -> Registry:
    """The registry in use here: the default one, or the one of an enclosing `with registry.active()`."""
    return _ACTIVE.get()


def register_pass(name: str | None = None, *, requires=(), provides=(), invalidates=(),
                  idempotent: bool = False, replace: bool = False, stage: str = "scheduler"):
    """Register a pass function `(graph, ctx, **options)`, or a class with an attrs `Options` class and
    a `run(self, graph, ctx, options)` method, in the active registry. Returns the PassInfo (callable like
    the function). `stage="fx"`: it runs on dynamo's FX graph before aot_autograd (see STAGES)."""
    return current_registry().register(name, requires=requires, provides=provides, invalidates=invalidates,
                                       idempotent=idempotent, replace=replace, stage=stage)


def unregister_pass(name: str) -> None:
    current_registry().unregister(name)


def get_pass(name: str) -> PassInfo:
    return current_registry().get(name)


def passes() -> dict[str, PassInfo]:
    """Every registered pass (built-in, user, and from installed packages' entry points), by name."""
    return current_registry().passes()


def providers(fact: str) -> list[str]:
    return current_registry().providers(fact)


def catalog_markdown() -> str:
    """The registered passes as a Markdown catalog (docs/passes.md embeds it; a test keeps it current)."""
    return current_registry().catalog_markdown()
