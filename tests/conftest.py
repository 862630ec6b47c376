import json
import os

import pytest
from hypothesis import HealthCheck, settings

# ci: derandomized and bounded, for make test. fuzz: a long randomized campaign, for make fuzz.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz", deadline=None, print_blob=True, max_examples=10_000,
                          suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- conformance (tests/test_conformance.py): outcomes per op_db entry, counted at the end of the run --
_CONFORMANCE: list = []


@pytest.fixture
def conformance_results():
    """A list each conformance test appends its outcome to; PASSLINE_CONFORMANCE_LOG=path also appends
    it there as a JSON line, as soon as it is known (a long run that is cut off keeps what it did)."""
    class Results(list):
        def append(self, row):
            _CONFORMANCE.append(row)
            path = os.environ.get("PASSLINE_CONFORMANCE_LOG")
            if path:
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")

    return Results()


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
