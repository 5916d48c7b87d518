# `make demo` and `make test` each set up .venv first (CPU torch from this machine's disk by default).
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

.PHONY: demo test
demo: $(VENV)/.installed
	$(VENV)/bin/giga-train train examples/char_lm/configs/cpu.py

test: $(VENV)/.installed $(VENV)/.triton
	$(PY) -m pytest -q
