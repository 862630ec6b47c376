# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU-only torch wheel: an unpinned torch pulls several GB of CUDA packages.
TORCH ?= torch==2.13.0
TRITON ?= triton==3.9.0

.PHONY: demo test fuzz venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "$(TRITON)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	TRITON_INTERPRET=1 $(PY) -m passline.demo

test: venv
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# A long randomized campaign (hypothesis profile "fuzz": 10,000 examples a property); failing
# examples are saved as reproducers in fuzz_failures/ and in hypothesis' database.
FUZZ_ARGS ?= -k "lowered or every_pass or idempotent"
fuzz: venv
	HYPOTHESIS_PROFILE=fuzz TRITON_INTERPRET=1 $(PY) -m pytest -q tests/test_fuzz.py $(FUZZ_ARGS) --hypothesis-show-statistics

clean:
	rm -rf $(VENV) build *.egg-info
