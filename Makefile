# `make demo` and `make test` each set up .venv first; `make test` runs ruff (pyproject's [tool.ruff]), then pytest (CPU torch from this machine's disk by default).
VENV ?= .venv
TORCH ?= torch==2.13.0
# triton runs the Triton kernels' tests on the CPU (TRITON_INTERPRET=1): installed with a CPU torch only (a
# CUDA torch brings its own). 3.6.0 is the GPU machine's; 3.9.0's interpreter refuses came_triton's int mask.
# Costs ~15 s and ~640 MB of set-up and ~2.5 min of `make test` on 2 cores. `make test TRITON=` skips them.
TRITON ?= triton==3.6.0
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	DS_BUILD_OPS=0 $(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

$(VENV)/.triton: $(VENV)/.installed Makefile
	if [ -n "$(TRITON)" ] && $(PY) -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then \
		$(PY) -m pip install -q --disable-pip-version-check '$(TRITON)'; fi
	touch $@

# The real GigaTrain 1.1.0 (+ giga-datasets) from the registry, in a venv of its own, for the differential
# tests in tests/reference (never in .venv: both are imported as `giga_train`).
REF_VENV ?= .venv-gigatrain
$(REF_VENV)/.installed: tests/reference/setup.sh tests/reference/constraints.txt
	bash tests/reference/setup.sh $(REF_VENV)

reference: $(REF_VENV)/.installed

.PHONY: demo test reference
demo: $(VENV)/.installed
	$(VENV)/bin/giga-train train examples/char_lm/configs/cpu.py

# The reference venv builds in the background while the other tests run; the tests that compare with
# GigaTrain run last (tests/conftest.py) and wait for it (tests/reference/harness.py holds a lock).
# giga_datasets (the `gigatrain` extra) is not installed in .venv: its torchvision import fails beside the
# CPU torch (the registry's torchvision wheels are CUDA builds). tests/test_giga_datasets.py runs our package
# under .venv-gigatrain's Python instead (torch 2.14.1 + torchvision 0.29.1, CUDA builds that run on the CPU),
# this repository first on PYTHONPATH so that our giga_train shadows GigaTrain's (docs/guide.md, "Data through giga_datasets").
test: $(VENV)/.installed $(VENV)/.triton
	$(VENV)/bin/ruff check giga_train tests bench examples
	$(PY) -c "from tests.reference import harness; harness.reference_python()" > .venv-gigatrain.log 2>&1 &
	$(PY) -m pytest -q
