"""passline's settings: every `PASSLINE_*` knob in one object, read from the environment once.

    passline.settings.dump_dir                      # what is in effect here
    with passline.settings(dump_dir="dumps", check=True):
        torch.compile(model, backend=passline.backend())(x)   # dumps, checked
    passline.backend(dump_dir="other")              # a backend's own arguments win over both

The environment is read when passline is imported (`Settings.from_environ`); `with passline.settings(...)`
overrides fields for the code inside the block (a context variable: threads and async tasks each see
their own). A backend takes the settings in effect when it is created, its own arguments over them, and
compiles every graph under those (`Backend.settings`). passline never writes an environment variable.

| field | variable | default | meaning |
|---|---|---|---|
| `cache_dir` | `PASSLINE_CACHE_DIR` | `~/.cache/passline` | kernel sources, tuning choices, scheduled graphs |
| `graph_cache` | `PASSLINE_GRAPH_CACHE` | on | reuse a graph's lowering and passes from an earlier process |
| | | | (backends/graph_cache.py) |
| `aot_cache` | `PASSLINE_AOT_CACHE` | on | reuse aot_autograd's tracing and partitioning from an earlier |
| | | | process too (backends/aot_cache.py; needs `graph_cache`) |
| `autotune` | `PASSLINE_AUTOTUNE` | off | time kernel candidates on a GPU (off: by rule, but for the |
| | | | rows `configs.uncertain` names, whose few candidates are timed) |
| `compile_in` | `PASSLINE_COMPILE_IN` | `processes` | static kernels compiled before the first call by |
| | | | `processes` (a worker pool), in `threads` or `off` (each at its first launch) |
| `check` | `PASSLINE_CHECK` | off | the accuracy guard (docs/debugging.md) |
| `dump_dir` | `PASSLINE_DUMP_DIR` | none | graph dumps around each pass that changed the graph |
| `fallback` | `PASSLINE_FALLBACK` | `eager` | `eager`: run a graph passline fails on as it is; `raise` |
| `metric_dir` | `PASSLINE_METRIC_DIR` | `passline_metrics` | where CSV metric tables go |
| `metric_tables` | `PASSLINE_METRIC_TABLES` | none | comma-separated tables to write, or `all` |
| `test_device` | `PASSLINE_TEST_DEVICE` | none | `passline.testing.assert_matches_eager` moves inputs there |
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path
from typing import Iterator, Mapping

import attrs

METRIC_TABLES = ("graph_stats", "fusion_failures", "kernel_metadata", "pass_stats")
FALLBACKS = ("eager", "raise")
COMPILE_IN = ("threads", "processes", "off")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _optional_str(value) -> str | None:
    return None if value is None or value == "" else os.fspath(value)


def _path(value) -> str:
    """A directory given as text or a path; `~` is the user's home, as in a shell (a literal `./~` was made)."""
    return os.path.expanduser(os.fspath(value))


def _optional_path(value) -> str | None:
    return None if value is None or value == "" else _path(value)


def as_bool(value, name: str) -> bool:
    """An on/off option given in Python: a bool (or 0/1), or the words the PASSLINE_* variables take. Any other
    value is an error: `check="no"` was kept as a true string and turned the guard on."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{name} must be True or False (or one of {', '.join(_TRUE + _FALSE)}), not {value!r}")


def parse_metric_tables(names) -> frozenset:
    """Table names (an iterable, or comma-separated text) as a set; `all` means every table."""
    if isinstance(names, str):
        names = names.split(",")
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in METRIC_TABLES and n != "all"]
    if unknown:
        raise ValueError(f"unknown metric table {unknown[0]!r}; tables: {', '.join(METRIC_TABLES)} (or all)")
    return frozenset(METRIC_TABLES if "all" in names else names)


def _fallback(_, attribute, value) -> None:
    if value not in FALLBACKS:
        raise ValueError(f"fallback must be 'eager' or 'raise', not {value!r}")


def _flag(text: str, variable: str, default: bool) -> bool:
    t = text.strip().lower()
    if t == "":
        return default
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"{variable}={text!r}: expected one of {', '.join(_TRUE + _FALSE)}")


def _compile_in(_, attribute, value) -> None:
    if value not in COMPILE_IN:
        raise ValueError(f"compile_in must be one of {', '.join(COMPILE_IN)}, not {value!r}")


@attrs.frozen
class Settings:
    """Every knob of passline (see the module doc for the variable and default of each)."""

    cache_dir: str = attrs.field(factory=lambda: str(Path.home() / ".cache" / "passline"), converter=_path)
    # configurations by rule; timing on request (issue 14)
    autotune: bool = attrs.field(default=False, converter=lambda v: as_bool(v, "autotune"))
    # scheduled graphs on disk (backends/graph_cache.py); on since a conformance campaign
    graph_cache: bool = attrs.field(default=True, converter=lambda v: as_bool(v, "graph_cache"))
    # aot_autograd's results on disk (backends/aot_cache.py); warm first steps measured 10-30% shorter
    aot_cache: bool = attrs.field(default=True, converter=lambda v: as_bool(v, "aot_cache"))
    check: bool = attrs.field(default=False, converter=lambda v: as_bool(v, "check"))
    # processes: workers forked from one booted zygote, each compile of the plan handed to one; cold first calls
    # on an H200 host 1.03x Inductor's for GPT-2-style (threads 1.26x), 1.10x for LLaMA-style (1.20x), warm ones
    # as threads' (docs/benchmarks.md, forty-fourth session). Threads share the GIL with Triton's front end
    compile_in: str = attrs.field(default="processes", validator=_compile_in)
    dump_dir: str | None = attrs.field(default=None, converter=_optional_path)
    fallback: str = attrs.field(default="eager", validator=_fallback)
    metric_dir: str = attrs.field(default="passline_metrics", converter=_path)
    metric_tables: frozenset = attrs.field(default=frozenset(), converter=parse_metric_tables)
    test_device: str | None = attrs.field(default=None, converter=_optional_str)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The settings the `PASSLINE_*` variables of `environ` (default: os.environ) give."""
        env = os.environ if environ is None else environ
        given: dict = {}
        if env.get("PASSLINE_CACHE_DIR"):
            given["cache_dir"] = env["PASSLINE_CACHE_DIR"]
        if "PASSLINE_AUTOTUNE" in env:
            given["autotune"] = _flag(env["PASSLINE_AUTOTUNE"], "PASSLINE_AUTOTUNE", False)
        if "PASSLINE_GRAPH_CACHE" in env:
            given["graph_cache"] = _flag(env["PASSLINE_GRAPH_CACHE"], "PASSLINE_GRAPH_CACHE", True)
        if "PASSLINE_AOT_CACHE" in env:
            given["aot_cache"] = _flag(env["PASSLINE_AOT_CACHE"], "PASSLINE_AOT_CACHE", True)
        if "PASSLINE_CHECK" in env:
            given["check"] = _flag(env["PASSLINE_CHECK"], "PASSLINE_CHECK", False)
        for field, variable in (("compile_in", "PASSLINE_COMPILE_IN"),
                                ("dump_dir", "PASSLINE_DUMP_DIR"), ("fallback", "PASSLINE_FALLBACK"),
                                ("metric_dir", "PASSLINE_METRIC_DIR"), ("test_device", "PASSLINE_TEST_DEVICE")):
            if env.get(variable):
                given[field] = env[variable]
        if "PASSLINE_METRIC_TABLES" in env:
            given["metric_tables"] = env["PASSLINE_METRIC_TABLES"]
        try:
            return cls(**given)
        except ValueError as e:
            raise ValueError(f"passline: bad PASSLINE_* environment variable: {e}") from None

    def evolve(self, **changes) -> "Settings":
        """A copy with `changes`; a change of None keeps the field as it is (an argument not given)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = set(changes) - {f.name for f in attrs.fields(Settings)}
        if unknown:
            raise TypeError(f"no setting {sorted(unknown)[0]!r}; settings: "
                            f"{', '.join(f.name for f in attrs.fields(Settings))}")
        return attrs.evolve(self, **changes)


ENVIRONMENT = Settings.from_environ()  # read once, when passline is imported
_CURRENT: contextvars.ContextVar[Settings] = contextvars.ContextVar("passline_settings", default=ENVIRONMENT)


def current_settings() -> Settings:
    """The settings in effect here: the environment's, with the overrides of enclosing `with` blocks."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_settings(settings: Settings) -> Iterator[Settings]:
    """Within: `settings` are in effect (a whole Settings object; see `passline.settings(...)` to change
    some fields)."""
    token = _CURRENT.set(settings)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)


class _SettingsAccess:
    """`passline.settings`: read a field (`passline.settings.dump_dir`), or override some in a block
    (`with passline.settings(dump_dir="d"): ...`)."""

    def __call__(self, **overrides) -> contextlib.AbstractContextManager[Settings]:
        return use_settings(current_settings().evolve(**overrides))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(current_settings(), name)

    def __dir__(self):
        return [f.name for f in attrs.fields(Settings)]

    def __repr__(self):
        return f"passline.settings: {current_settings()!r}"


settings = _SettingsAccess()


@contextlib.contextmanager
def environment_variable(name: str, value: str | None) -> Iterator[None]:
    """Within: environment variable `name` is `value` (None: unset); afterwards exactly what it was,
    whatever the user had set. For libraries that read their configuration from the environment only
    (Triton's TRITON_INTERPRET)."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
