"""Pipelines as objects and as text, one-to-one.

    dce, fuse(max_nodes=32, horizontal=false), repeat(fuse, reorder_loops; max_iter=4), mix_order_reduction

`Pipeline.parse(text)` builds the object; `str(pipeline)` prints text that parses back to an equal
pipeline. Both forms are checked against the registry: pass names, option names, types and values,
that each pass's `requires` facts are provided earlier, and that FX-stage passes (registry.STAGES) come
first. Errors point at the position in the text.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable, Iterator

import attrs

from .registry import PassInfo, PipelineError, get_pass

INITIAL_FACTS = frozenset({"lowered"})  # what lowering guarantees before any pass runs
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def _format_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if _IDENT.fullmatch(v) and v not in ("true", "false") else '"' + v.replace('"', '\\"') + '"'
    return repr(v)


@attrs.frozen
class PassCall:
    """One pass with the options given for it."""

    name: str
    options: tuple = ()  # ((option, value), ...) in the pass's declaration order

    @classmethod
    def make(cls, name: str, options: dict) -> "PassCall":
        info = get_pass(name)
        coerced = {k: info.option(k).coerce(v, name) for k, v in options.items()}
        order = [o.name for o in info.options]
        return cls(name, tuple(sorted(coerced.items(), key=lambda kv: order.index(kv[0]))))

    @property
    def info(self) -> PassInfo:
        return get_pass(self.name)

    def resolved(self) -> dict:
        """Every option's value: the given ones over the defaults."""
        return {**self.info.defaults(), **dict(self.options)}

    def __str__(self):
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={_format_value(v)}' for k, v in self.options)})"


@attrs.frozen
class Repeat:
    """Run `items` again and again until an iteration changes nothing, at most `max_iter` times."""

    items: tuple
    max_iter: int = 10

    def __attrs_post_init__(self):
        if not isinstance(self.max_iter, int) or isinstance(self.max_iter, bool) or self.max_iter < 1:
            raise PipelineError(f"repeat's max_iter must be a positive int, got {self.max_iter!r}")
        if not self.items:
            raise PipelineError("repeat(...) needs at least one pass")

    def __str__(self):
        inner = ", ".join(map(str, self.items))
        return f"repeat({inner}; max_iter={self.max_iter})" if self.max_iter != 10 else f"repeat({inner})"


def repeat(*items, max_iter: int = 10) -> Repeat:
    """A fixed-point group for the Python form: `repeat("fuse", "reorder_loops", max_iter=4)`."""
    return Repeat(tuple(_items(items)), max_iter)


def _items(items: Iterable) -> Iterator:
    for it in items:
        if isinstance(it, str):  # a text fragment; facts are checked on the whole pipeline
            yield from _Parser(it).parse()[0]
        elif isinstance(it, PassInfo):
            yield PassCall(it.name)
        elif isinstance(it, Pipeline):
            yield from it.items
        elif isinstance(it, (PassCall, Repeat)):
            if isinstance(it, PassCall):
                get_pass(it.name)
            yield it
        else:
            raise PipelineError(f"cannot use {it!r} in a pipeline (want a pass name, a configured pass, "
                                f"repeat(...) or a Pipeline)")


def _to_items(items) -> tuple:
    return tuple(_items([items] if isinstance(items, str) else items))


@attrs.frozen
class Pipeline:
    """An ordered list of passes and fixed-point groups."""

    items: tuple = attrs.field(default=(), converter=_to_items)

    def __attrs_post_init__(self):
        check_stages(self.items)
        check_facts(self.items)

    @classmethod
    def parse(cls, text: str) -> "Pipeline":
        items, positions = _Parser(text).parse()
        check_stages(items, text, positions)
        check_facts(items, text, positions)
        pipeline = object.__new__(cls)
        object.__setattr__(pipeline, "items", tuple(items))
        return pipeline

    def __str__(self):
        return ", ".join(map(str, self.items))

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)

    def calls(self) -> list[PassCall]:
        """Each pass call once, in order, with repeat groups opened."""
        return _opened(self.items)

    def fx_calls(self) -> list[PassCall]:
        """The FX-stage passes, in their written order: what the dynamo backend runs on each captured graph
        before aot_autograd."""
        return [it for it in self.items if _fx(it)]

    def scheduler_items(self) -> tuple:
        """The items that are not FX-stage passes, in their written order: what runs on each lowered graph."""
        return tuple(it for it in self.items if not _fx(it))

    def max_runs(self) -> int:
        """An upper bound on pass executions: each repeat group at its max_iter."""
        def bound(items):
            return sum(it.max_iter * bound(it.items) if isinstance(it, Repeat) else 1 for it in items)

        return bound(self.items)

    def cache_key(self) -> str:
        """A key for caches of anything this pipeline produced: derived from the pipeline text, every
        option's value (defaults included), the source of every pass's module and passline's version,
        so that editing a pass invalidates caches without anyone writing a uuid."""
        from .. import __version__

        h = hashlib.sha256()
        h.update(f"passline {__version__}\n{self}\n".encode())
        for call in self.calls():
            h.update(f"{call.name} {sorted(call.resolved().items())!r} {call.info.source_hash()}\n".encode())
        return h.hexdigest()


def _opened(items) -> list[PassCall]:
    out: list[PassCall] = []
    for it in items:
        out.extend(_opened(it.items) if isinstance(it, Repeat) else [it])
    return out


def _fx(item) -> bool:
    """Whether a top-level item is an FX-stage pass (they run on dynamo's graph, before lowering)."""
    return isinstance(item, PassCall) and item.info.stage == "fx"


def check_stages(items, text: str | None = None, positions: dict | None = None) -> None:
    """FX-stage passes rewrite dynamo's graph once, before it is split and lowered: none inside repeat(...).
    Written after scheduler passes they still run first, in their written order (their stage runs before
    lowering), so that `"my_pass, " + passline.DEFAULT_PIPELINE`, whose first pass works on the FX graph,
    means what it says."""
    def where(call):
        return positions.get(id(call)) if positions else None

    for it in items:
        for call in _opened((it,)):
            if call.info.stage == "fx" and isinstance(it, Repeat):
                raise PipelineError(f"pass {call.name!r} works on dynamo's FX graph (stage fx) and runs once per "
                                    f"captured graph: it cannot be inside repeat(...)", text, where(call))


def check_facts(items, text: str | None = None, positions: dict | None = None, facts=INITIAL_FACTS) -> frozenset:
    """Check that every pass's `requires` is provided by an earlier pass; return the facts after `items`."""
    from .registry import providers

    facts = frozenset(facts)
    for it in items:
        if isinstance(it, Repeat):
            facts = check_facts(it.items, text, positions, facts)
            continue
        info = it.info
        missing = sorted(info.requires - facts)
        if missing:
            fact = missing[0]
            who = providers(fact)
            hint = (f"; {' or '.join(map(repr, who))} provides it — put it before {it.name!r}" if who
                    else "; no registered pass provides it")
            raise PipelineError(f"pass {it.name!r} requires {fact!r}, which no earlier pass provides{hint}",
                                text, positions.get(id(it)) if positions else None)
        facts = (facts | info.provides) - info.invalidates
    return facts


class _Parser:
    _TOKEN = re.compile(r"""\s*(?:(?P<num>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(?P<str>"(?:[^"\\]|\\.)*"|'[^']*')
                            |(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)|(?P<punct>[(),;=]))""", re.X)

    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = self._TOKEN.match(text, pos)
            if not m or m.end() == pos:
                start = len(text) - len(text[pos:].lstrip())
                raise PipelineError(f"unexpected character {text[start]!r}", text, start)
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.k = 0
        self.positions: dict[int, int] = {}

    def error(self, msg: str, pos: int | None = None):
        if pos is None:
            pos = self.tokens[self.k][2] if self.k < len(self.tokens) else len(self.text)
        raise PipelineError(msg, self.text, pos)

    def peek(self):
        return self.tokens[self.k] if self.k < len(self.tokens) else ("end", "", len(self.text))

    def take(self, value=None, kind=None, what=None):
        tok = self.peek()
        if (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            want = what or (repr(value) if value else f"a {kind}")
            got = "the end of the pipeline" if tok[0] == "end" else repr(tok[1])
            self.error(f"expected {want}, found {got}", tok[2])
        self.k += 1
        return tok

    def parse(self):
        items = self.items(stop=("end",))
        if self.peek()[0] != "end":
            self.error(f"expected ',' between passes, found {self.peek()[1]!r}")
        return items, self.positions

    def items(self, stop) -> list:
        items = []
        if self.peek()[0] == "end" or self.peek()[1] in stop:
            return items
        while True:
            items.append(self.item())
            if self.peek()[1] == ",":
                self.take(",")
                continue
            return items

    def item(self):
        kind, name, pos = self.take(kind="name", what="a pass name")
        if name == "repeat":
            self.take("(")
            body = self.items(stop=(";", ")"))
            if not body:
                self.error("repeat(...) needs at least one pass")
            opts = self.options() if self.peek()[1] == ";" and self.take(";") else {}
            self.take(")")
            bad = set(opts) - {"max_iter"}
            if bad:
                self.error(f"repeat has no option {sorted(bad)[0]!r} (it takes max_iter)", pos)
            try:
                item = Repeat(tuple(body), **{k: v for k, (v, _) in opts.items()})
            except PipelineError as e:
                self.error(e.reason, opts.get("max_iter", (None, pos))[1])
        else:
            opts = {}
            if self.peek()[1] == "(":
                self.take("(")
                opts = self.options() if self.peek()[1] != ")" else {}
                self.take(")")
            try:
                info = get_pass(name)
            except PipelineError as e:
                self.error(e.reason, pos)
            values = {}
            for k, (v, vpos) in opts.items():
                try:
                    values[k] = info.option(k).coerce(v, name)
                except PipelineError as e:
                    self.error(e.reason, vpos)
            order = [o.name for o in info.options]
            item = PassCall(name, tuple(sorted(values.items(), key=lambda kv: order.index(kv[0]))))
        self.positions[id(item)] = pos
        return item

    def options(self) -> dict:
        opts = {}
        while True:
            _, key, kpos = self.take(kind="name", what="an option name (name=value)")
            if key in opts:
                self.error(f"option {key!r} given twice", kpos)
            self.take("=")
            kind, raw, vpos = self.peek()
            if kind not in ("num", "str", "name"):
                self.error(f"expected a value for option {key!r}", vpos)
            self.k += 1
            opts[key] = (self.value(kind, raw), kpos)
            if self.peek()[1] != ",":
                return opts
            self.take(",")

    @staticmethod
    def value(kind: str, raw: str):
        if kind == "num":
            return float(raw) if any(c in raw for c in ".eE") else int(raw)
        if kind == "str":
            return raw[1:-1].replace('\\"', '"')
        return {"true": True, "false": False}.get(raw, raw)
