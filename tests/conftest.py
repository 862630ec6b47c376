import json
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# ci: derandomized and bounded, for make test. fuzz: a long randomized campaign, for make fuzz.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz", deadline=None, print_blob=True, max_examples=10_000,
                          suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Under pytest-xdist (make test: a worker per core) each worker gets its share of the cores for torch's
# own thread pool, so the workers' threads do not outnumber the cores and spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# A function compiled more often than dynamo's recompile limit (8 guards failing in turn) is run eagerly from then
# on, silently: a test comparing it with eager would compare eager with eager and pass whatever passline does (a
# parametrized test compiling nn.EmbeddingBag.forward for 18 cases did, until it reset dynamo per case). Hitting the
# limit is an error here, and each test starts from a reset dynamo, so that no test's compiles count against
# another's (xdist's workers run them in any order).
torch._dynamo.config.fail_on_recompile_limit_hit = True


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


# PASSLINE_TEST_TARGET=cuda:132 — the passes plan every graph for a GPU of that many SMs while the kernels still
# run here (Triton's interpreter, the reference backend): the schedules a GPU run (PASSLINE_TEST_DEVICE=cuda)
# makes, on a machine without one. A test whose expected schedule is the CPU target's then fails here as it would
# there (few rows are not mixed for 132 SMs: thirteen such tests were found on an H200 in the forty-first
# session); tests about the CPU target itself are marked `cpu_target` and skipped. (A cached graph's key names
# the target it was planned for: backends/graph_cache.py.)
_TARGET = os.environ.get("PASSLINE_TEST_TARGET")
if _TARGET:
    from passline.pipeline import target as _target

    _device, _, _sms = _TARGET.partition(":")
    if _device != "cuda" or not _sms.isdigit() or int(_sms) < 1:
        raise pytest.UsageError(f"PASSLINE_TEST_TARGET={_TARGET!r}: expected cuda:SMS, e.g. cuda:132 (an H100 or H200)")
    _target.Target.of = classmethod(lambda cls, graph: cls("cuda", int(_sms), False))
    _target.Target.of_devices = classmethod(lambda cls, devices: cls("cuda", int(_sms), False))


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_target: the test is about the CPU target's own schedule (skipped "
                                       "under PASSLINE_TEST_TARGET)")


def pytest_collection_modifyitems(config, items):
    if _TARGET:
        skip = pytest.mark.skip(reason=f"about the CPU target (PASSLINE_TEST_TARGET={_TARGET})")
        for item in items:
            if "cpu_target" in item.keywords:
                item.add_marker(skip)


# -- conformance (tests/test_conformance.py): outcomes per op_db entry, counted at the end of the run --
# Each row travels on its test's report (user_properties), not in a module global: under pytest-xdist
# (make test runs a worker per core) the tests run in worker processes and only their reports reach the process that
# prints the summary.
_CONFORMANCE: list = []


@pytest.fixture
def conformance_results(request):
    """A list each conformance test appends its outcome to; PASSLINE_CONFORMANCE_LOG=path also appends
    it there as a JSON line, as soon as it is known (a long run that is cut off keeps what it did)."""
    class Results(list):
        def append(self, row):
            request.node.user_properties.append(("conformance", row))
            path = os.environ.get("PASSLINE_CONFORMANCE_LOG")
            if path:
                with open(path, "a") as f:  # one short O_APPEND write a row: workers do not interleave
                    f.write(json.dumps(row) + "\n")

    return Results()


def pytest_runtest_logreport(report):
    if report.when == "call":
        _CONFORMANCE.extend(row for key, row in report.user_properties if key == "conformance")


def pytest_terminal_summary(terminalreporter):
    if not _CONFORMANCE:
        return
    counts: dict = {}
    for row in _CONFORMANCE:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    native = sorted({r["op"] for r in _CONFORMANCE if r["outcome"] == "native"})
    terminalreporter.write_line(
        "conformance (op_db entry x dtype): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; {len(native)} ops native in some dtype")
    for r in _CONFORMANCE:
        if r["outcome"] == "refused":
            terminalreporter.write_line(f"  refused {r['op']} {r['dtype']}: {r['detail']}")
