# The two commands of the README: `make test` and `make bench`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test bench install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch is pinned to the CPU wheel on this machine's disk; an open range would pull a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/pip install -q --no-deps --force-reinstall . >/dev/null
	cd tests && ../$(BIN)/python -m pytest -p no:cacheprovider -n auto --dist loadfile .

bench: install
	$(BIN)/pip install -q --no-deps --force-reinstall . >/dev/null
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install -q 'matplotlib>=3.5'
	$(BIN)/python benchmarks/bench_losses.py
	$(BIN)/python benchmarks/bench_crossover.py
	$(BIN)/python benchmarks/bench_crossover.py --fixed
	$(BIN)/python benchmarks/bench_math.py
	$(BIN)/python benchmarks/bench_inplace.py

clean:
	rm -rf $(VENV) build *.egg-info
