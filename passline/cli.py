"""The `passline` command.

    passline passes                                   the registry: passes, doc lines, options
    passline explain FILE.py:FN [--pipeline TEXT] [--shape 8x64 ...] [--dtype float32] [--backward]
                     [--choice mm=decompose_k]
    passline draw FILE.py:FN --out graph.svg [--graph backward] [...]
    passline bisect FILE.py:FN --pipeline TEXT [...]

FN names a function or an nn.Module subclass (built with no arguments) in FILE.py. Its example inputs
are `--shape` tensors (one per input, random normal), or come from an `example_inputs()` function in
the same file.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import shutil
import subprocess
import sys
from pathlib import Path

from .pipeline.instruments import PassInstrument


class CliError(Exception):
    pass


def _load(target: str):
    if ":" not in target:
        raise CliError(f"expected FILE.py:FN, got {target!r}")
    file, name = target.rsplit(":", 1)
    path = Path(file)
    if not path.is_file():
        raise CliError(f"no such file: {file}")
    spec = importlib.util.spec_from_file_location(f"passline_cli_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        names = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                 and getattr(v, "__module__", None) == module.__name__]  # its own functions and classes
        raise CliError(f"{file} has no {name!r} (it defines: {', '.join(names)})")
    fn = getattr(module, name)
    import torch

    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        try:
            inspect.signature(fn).bind()
        except TypeError as e:
            raise CliError(f"{name} cannot be made without arguments ({e}): give a function, or a module class "
                           f"whose constructor needs none") from None
        fn = fn()
    if not callable(fn) or isinstance(fn, type):  # (a module is not callable)
        raise CliError(f"{name} in {file} is a {type(fn).__name__}, not a function or an nn.Module class")
    return fn, getattr(module, "example_inputs", None)


def _inputs(args, factory):
    import torch

    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise CliError(f"unknown dtype {args.dtype!r}")
    if args.shape:
        try:
            shapes = [tuple(int(s) for s in sh.lower().split("x")) for sh in args.shape]
        except ValueError:
            raise CliError(f"shapes look like 8x64, got {args.shape}") from None
        if any(n < 0 for shape in shapes for n in shape):
            raise CliError(f"sizes are 0 or more, got {args.shape}")
        torch.manual_seed(0)
        return [torch.randn(s, dtype=dtype, requires_grad=args.backward) for s in shapes]
    if factory is None:
        raise CliError("give --shape for each input, or define example_inputs() in the file")
    made = factory()
    if not isinstance(made, (list, tuple)):
        raise CliError(f"example_inputs() returns the inputs as a list or tuple, not a {type(made).__name__}")
    return list(made)


def _arity(fn, inputs: list) -> None:
    """A CliError where `fn` cannot take `inputs` (the count of --shape flags)."""
    target = fn.forward if hasattr(fn, "forward") else fn
    try:
        inspect.signature(target).bind(*inputs)
    except TypeError as e:
        raise CliError(f"{getattr(target, '__qualname__', 'FN')} cannot take {len(inputs)} inputs ({e}): "
                       f"one --shape an input") from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass


def _compile(args, instruments=()):
    import torch

    import passline

    fn, factory = _load(args.target)
    inputs = _inputs(args, factory)
    _arity(fn, inputs)
    torch._dynamo.reset()
    overrides = {}
    for item in getattr(args, "choice", None) or ():
        op, sep, name = item.partition("=")
        if not sep:
            raise CliError(f"--choice takes OP=NAME (e.g. mm=decompose_k), got {item!r}")
        overrides[op.strip()] = name.strip()
    try:
        be = passline.backend(args.pipeline, codegen=args.codegen, instruments=instruments, fallback="raise",
                              choice_overrides=overrides)
    except ValueError as e:  # an unknown op or candidate in --choice
        raise CliError(str(e)) from None
    out = torch.compile(fn, backend=be)(*inputs)
    if args.backward:
        outs = out if isinstance(out, (tuple, list)) else [out]
        torch.autograd.backward([o for o in outs if o.requires_grad],
                                [torch.ones_like(o) for o in outs if o.requires_grad])
    return be, fn, inputs


def cmd_passes(args) -> int:
    import passline

    for info in passline.passes().values():
        print(f"{info.name:22s} {info.summary}")
        for o in info.options:
            doc = f"  — {o.doc}" if o.doc else ""
            print(f"    {o.name} ({o.type.__name__}, default {o.default!r}){doc}")
        facts = [f"{k} {', '.join(sorted(v))}" for k, v in (("requires", info.requires),
                 ("provides", info.provides), ("invalidates", info.invalidates)) if v]
        if facts:
            print(f"    facts: {'; '.join(facts)}")
        if info.stage != "scheduler":
            print(f"    stage: {info.stage} (dynamo's FX graph, before aot_autograd; runs before the scheduler passes)")
    return 0


class _Changes(PassInstrument):
    """Instrument: the graph before the pipeline and after each pass that changed it."""

    def __init__(self):
        self.snapshots = []

    def before_pass(self, call, graph):
        if not self.snapshots or self.snapshots[-1][0] == "__done__":
            self.snapshots.append(("(input)", graph.format()))

    def after_pass(self, record, graph):
        if record.changed:
            self.snapshots.append((record.call, graph.format()))


def cmd_explain(args) -> int:
    from passline.passes.legality import REASONS

    changes = _Changes()
    be, _, _ = _compile(args, [changes])
    for report in be.reports:
        print(f"== {report.summary()}")
        print(f"   pipeline: {report.pipeline}")
        print(f"   {'pass':44s} {'ms':>8} {'nodes':>11} changed  stats")
        for r in report.passes:
            it = f" #{r.iteration}" if r.iteration else " [fx]" if r.stage == "fx" else ""
            print(f"   {(r.call + it)[:44]:44s} {r.seconds * 1e3:8.2f} {r.nodes_before:>5}→{r.nodes_after:<5} "
                  f"{'yes' if r.changed else 'no ':7s}  {r.stats or ''}")
        print(f"   kernels: {report.kernels}, extern calls: {report.externs}, bytes accessed: {report.bytes_accessed}")
        if report.choices:
            print("   choices (node (op): chosen [how] among candidates; timings):")
            for c in report.choices:
                print(f"     {c}")
        seen = {}
        for f in report.metrics.refusals:
            seen.setdefault(f.reason, f)
        if seen:
            print("   not fused (one example per reason):")
            for reason, f in seen.items():
                print(f"     {f.a} + {f.b}: {reason} — {REASONS.get(reason, '')}"
                      + (f" ({f.detail})" if f.detail else ""))
        if args.graphs:
            print("   graph after the pipeline:")
            print("     " + report.graph.format().replace("\n", "\n     "))
    if args.graphs:
        for label, text in changes.snapshots:
            print(f"-- after {label}:\n{text}")
    return 0


def cmd_draw(args) -> int:
    from passline.pipeline.dump import to_dot

    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"no such directory for --out: {out.parent}")
    be, _, _ = _compile(args)
    reports = [r for r in be.reports if r.name.startswith(args.graph)]
    if not reports:
        names = ", ".join(r.name for r in be.reports)
        raise CliError(f"no compiled graph is {args.graph!r} (compiled: {names}"
                       f"{'; a backward needs --backward' if args.graph.startswith('b') else ''})")
    report = reports[-1]
    # the graph as lowered, each node coloured by the kernel it ends up in
    from passline.ir import members
    from passline.lowering import lower_graph
    from passline.lowering.choices import Replay
    from passline.pipeline import SchedulerGraph

    before = SchedulerGraph.from_program(lower_graph(report.gm, chooser=Replay(report.choices)))
    palette = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
               "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]
    colors = {}
    for k, node in enumerate(report.graph.nodes()):
        for m in members(node):
            colors[m.name] = palette[k % len(palette)]
    title = f"{report.name}: {len(before)} nodes before, {len(report.graph)} after ({report.pipeline})"
    dot = to_dot(before, colors=colors, title=title)
    if out.suffix in (".svg", ".png", ".pdf") and shutil.which("dot"):
        subprocess.run(["dot", f"-T{out.suffix[1:]}", "-o", str(out)], input=dot, text=True, check=True)
        print(f"wrote {out} ({len(before)} nodes, coloured by the {report.kernels} kernels they end up in)")
    else:
        dot_path = out if out.suffix == ".dot" else out.with_suffix(".dot")
        dot_path.write_text(dot)
        why = "" if out.suffix == ".dot" else " (graphviz's dot is not installed: DOT text instead)"
        print(f"wrote {dot_path}{why}")
    return 0


def cmd_bisect(args) -> int:
    import passline

    fn, factory = _load(args.target)
    inputs = _inputs(args, factory)
    _arity(fn, inputs)
    report = passline.bisect(fn, inputs, pipeline=args.pipeline, codegen=args.codegen, save_dir=args.save_dir)
    print(report)
    return 0 if report.matches else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="passline", description="passline: declarative pass pipelines for torch.compile")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("passes", help="list the registered passes and their options")

    def target_parser(name, help):
        p = sub.add_parser(name, help=help)
        p.add_argument("target", help="FILE.py:FN (a function or an nn.Module class)")
        p.add_argument("--pipeline", default=None, help="pipeline text (default: passline.DEFAULT_PIPELINE)")
        p.add_argument("--shape", action="append", help="an input's shape, e.g. 8x64 (repeat per input)")
        p.add_argument("--dtype", default="float32")
        p.add_argument("--backward", action="store_true", help="also compile and run the backward")
        p.add_argument("--codegen", default="reference", choices=["auto", "triton", "reference"])
        if name != "bisect":
            p.add_argument("--choice", action="append", metavar="OP=NAME", help="implement OP's nodes by "
                           "candidate NAME where it applies, e.g. mm=decompose_k (repeatable)")
        return p

    p = target_parser("explain", "compile FN and show passes, kernels and why pairs were not fused")
    p.add_argument("--graphs", action="store_true", help="print the graph before and after each changing pass")
    p = target_parser("draw", "draw the scheduler graph, nodes coloured by their kernel")
    p.add_argument("--out", required=True, help="graph.svg (needs graphviz) or graph.dot")
    p.add_argument("--graph", default="", help="which compiled graph: forward, backward, inference")
    p = target_parser("bisect", "find the pass run and decision that break FN's result")
    p.add_argument("--save-dir", default=None, help="where to save the reproducer")
    args = ap.parse_args(argv)
    try:
        commands = {"passes": cmd_passes, "explain": cmd_explain, "draw": cmd_draw, "bisect": cmd_bisect}
        return commands[args.command](args)
    except CliError as e:
        print(f"passline {args.command}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a pipeline error, a lowering error: say it plainly
        from passline.pipeline.registry import PipelineError

        if isinstance(e, PipelineError):
            print(f"passline {args.command}: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
