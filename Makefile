# `make demo` and `make test` each set up .venv first (CPU torch from this machine's disk by default).
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	DS_BUILD_OPS=0 $(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

.PHONY: demo test
demo: $(VENV)/.installed
	$(VENV)/bin/giga-train train examples/char_lm/configs/cpu.py

test: $(VENV)/.installed
	$(PY) -m pytest -q
