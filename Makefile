# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU-only torch wheel: an unpinned torch pulls several GB of CUDA packages.
TORCH ?= torch==2.13.0
TRITON ?= triton==3.9.0

.PHONY: demo lint test fuzz conformance venv clean

# --no-cache-dir: a fresh machine installs once, and a copy of each wheel in pip's cache only costs disk
# (a CI run once failed with "No space left on device" while installing torch)
PIP_INSTALL := $(PY) -m pip install -q --no-cache-dir

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) "$(TORCH)" "$(TRITON)"
	$(PIP_INSTALL) -e ".[test]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	TRITON_INTERPRET=1 $(PY) -m passline.demo

# ruff (configured in pyproject.toml: pyflakes, pycodestyle, import order, bugbear) before the tests, so CI
# (which runs make test) enforces it.
lint: venv
	$(PY) -m ruff check .

# One pytest-xdist worker per core (-n auto): the interpreter and dynamo run Python, one core per
# process, so one process left CI's second core mostly idle; the workers add no work (the whole suite,
# 2026-11-23: 958 s of CPU in 2 workers, 968 s in one process). worksteal: an idle worker takes tests
# queued on the other, so the long tests (doc examples, the model smoke run) do not leave one core idle
# at the end. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto
test: lint
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# A long randomized campaign (hypothesis profile "fuzz": 10,000 examples a property); failing
# examples are saved as reproducers in fuzz_failures/ and in hypothesis' database.
FUZZ_ARGS ?= -k "lowered or every_pass or idempotent"
fuzz: venv
	HYPOTHESIS_PROFILE=fuzz TRITON_INTERPRET=1 $(PY) -m pytest -q tests/test_fuzz.py $(FUZZ_ARGS) --hypothesis-show-statistics

# Every entry of PyTorch's op database (OpInfo) through the Triton path on the interpreter, float32 and
# bfloat16, forward and backward; prints the counts by outcome (make test runs a fixed slice).
CONFORMANCE_LOG ?= conformance.jsonl
conformance: venv
	rm -f $(CONFORMANCE_LOG)
	PASSLINE_CONFORMANCE=full PASSLINE_CONFORMANCE_LOG=$(CONFORMANCE_LOG) TRITON_INTERPRET=1 $(PY) -m pytest -q tests/test_conformance.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
