"""Property tests: random programs x random pipelines match eager; every pass keeps verify() and the
graph's results; idempotent passes are idempotent. `make fuzz` runs them long and randomized."""
import os
import pathlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import passline
from passline.backends.reference import ReferenceRunner
from passline.testing import assert_matches_eager, pipelines, programs, tolerance

FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
FAILURES = pathlib.Path(os.environ.get("PASSLINE_FUZZ_DIR", "fuzz_failures"))


def save_reproducer(program, pipeline, error) -> None:
    """Keep a failing example: its program, pipeline and inputs, re-runnable with torch.load."""
    FAILURES.mkdir(exist_ok=True)
    n = len(list(FAILURES.glob("*.pt")))
    torch.save({"program": repr(program), "steps": program.steps, "inputs": program.inputs,
                "outputs": program.outputs, "pipeline": str(pipeline), "error": repr(error)[:2000]},
               FAILURES / f"failure{n}.pt")


def check(program, pipeline, codegen):
    try:
        assert_matches_eager(program, list(program.inputs), pipeline=pipeline, codegen=codegen)
    except Exception as e:
        if FUZZ:
            save_reproducer(program, pipeline, e)
        raise


@settings(max_examples=10_000 if FUZZ else 200)
@given(programs(), pipelines())
def test_random_programs_and_pipelines_match_eager_reference(program, pipeline):
    check(program, pipeline, "reference")


@settings(max_examples=10_000 if FUZZ else 40)
@given(programs(), pipelines())
def test_random_programs_and_pipelines_match_eager_triton(program, pipeline):
    check(program, pipeline, "triton")


def lowered(program):
    from torch.fx.experimental.proxy_tensor import make_fx

    from passline.lowering import decomposition_table, lower_graph
    from passline.pipeline import SchedulerGraph

    gm = make_fx(program, decomposition_table=decomposition_table())(*program.inputs)
    return SchedulerGraph.from_program(lower_graph(gm))


BUILTIN = sorted(n for n in passline.passes() if not n.startswith("t_"))


@settings(max_examples=10_000 if FUZZ else 100)
@given(programs(), pipelines())
def test_random_pipelines_on_lowered_programs_match_eager(program, pipeline):
    """The same property without dynamo: lower once with make_fx, run the pipeline, compare the
    reference backend's results with eager PyTorch's (fast enough for long campaigns)."""
    try:
        graph = lowered(program)
        out, _ = passline.PassManager(pipeline).run(graph)
        got = ReferenceRunner(out)(*program.inputs)
        for a, b in zip(got, program(*program.inputs)):
            torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)
    except Exception as e:
        if FUZZ:
            save_reproducer(program, pipeline, e)
        raise


@pytest.mark.parametrize("name", BUILTIN)
@settings(max_examples=2000 if FUZZ else 25)
@given(program=programs(), data=st.data())
def test_every_pass_keeps_verify_and_results(name, program, data):
    graph = lowered(program)
    expected = ReferenceRunner(graph.copy())(*program.inputs)
    options = data.draw(pipelines(names=[name], max_len=1))
    out, _ = passline.PassManager(options if len(options) else name).run(graph)  # verifies after the pass
    got = ReferenceRunner(out)(*program.inputs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **tolerance(b.dtype), equal_nan=True)


@pytest.mark.parametrize("name", [n for n in BUILTIN if passline.passes()[n].idempotent])
@settings(max_examples=1000 if FUZZ else 20)
@given(program=programs())
def test_idempotent_passes_are_idempotent(name, program):
    graph, _ = passline.PassManager(name).run(lowered(program))
    _, (again,) = passline.PassManager(name).run(graph)
    assert not again.changed
