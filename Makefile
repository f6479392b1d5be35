# The two commands of the README: `make test` and `make bench`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test bench bench-smoke test-isa install clean smoke-setup smoke-report smoke-tables smoke-channel-first \
	smoke-crossovers smoke-crossover-script smoke-math smoke-compile smoke-train

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
	$(BIN)/python benchmarks/bench_losses.py --train --load
	$(BIN)/python benchmarks/bench_load.py

# Every benchmark entry point (each table, its child processes, the plot and the report) at small sizes, so that
# a broken benchmark path fails CI; `make bench` times the same paths at full size. The steps are independent
# (the report aside: it reads the tables' output), so `make -j2 bench-smoke` runs two at a time.
SMOKE ?= $(or $(TMPDIR),/tmp)/autogen-bench-smoke
SMOKE_STEPS := smoke-tables smoke-channel-first smoke-crossovers smoke-crossover-script smoke-math smoke-compile smoke-train
bench-smoke: smoke-report $(SMOKE_STEPS)
smoke-setup: install
	$(BIN)/pip install -q --no-deps --force-reinstall . >/dev/null
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install -q 'matplotlib>=3.5'
	rm -rf $(SMOKE) && mkdir -p $(SMOKE)
smoke-tables: smoke-setup
	$(BIN)/python benchmarks/bench_losses.py --quick --elems 4096 --losses mse_loss \
		--nonlinearities relu --out $(SMOKE)
	$(BIN)/python benchmarks/bench_losses.py --custom --quick --no-compile --elems 4096 --out $(SMOKE)
smoke-report: smoke-tables
	cp README.md $(SMOKE)/README.md
	$(BIN)/python benchmarks/bench_losses.py --report $(SMOKE)/performance.md --readme $(SMOKE)/README.md --out $(SMOKE)
smoke-channel-first: smoke-setup
	$(BIN)/python benchmarks/bench_losses.py --channel-first --quick --no-compile
smoke-crossovers: smoke-setup
	cp autogen/thresholds.json $(SMOKE)/thresholds.json
	$(BIN)/python benchmarks/bench_losses.py --crossovers --quick --sizes 1K,4K --nonlinearities relu gelu \
		--write $(SMOKE)/thresholds.json
smoke-crossover-script: smoke-setup
	cp autogen/loss_thresholds.json $(SMOKE)/loss_thresholds.json
	$(BIN)/python benchmarks/bench_crossover.py --sizes 1K,4K mse_loss SoftDice --write $(SMOKE)/loss_thresholds.json
	$(BIN)/python benchmarks/bench_crossover.py --fixed --sizes 1K mse_loss
smoke-math: smoke-setup
	$(BIN)/python benchmarks/bench_math.py --elems 1K --reps 1 exp gelu
	$(BIN)/python benchmarks/bench_inplace.py --reps 1 --sizes 1K mish
	$(BIN)/python benchmarks/bench_load.py --reps 3 --configs default
	$(BIN)/python benchmarks/bench_fronts.py --rounds 2 --calls 10
smoke-compile: smoke-setup
	$(BIN)/python benchmarks/bench_compile.py mse_loss
smoke-train: smoke-setup
	$(BIN)/python benchmarks/bench_losses.py --train --quick --load --out $(SMOKE)

# The tests of math functions and ISA-specific paths (mathlib and specfun, the 16-bit loads and stores, gelu's
# erf) again, on an AVX2 target and on generic x86-64 (numba's features and torch's capability both lowered),
# each target with kernels of its own in numba's cache. One pytest per target, its tests dealt out one by one
# (--dist load): by file, one worker would run the 16-bit file alone.
ISA_TARGETS := "NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=-avx512f ATEN_CPU_CAPABILITY=avx2" \
	"NUMBA_CPU_NAME=generic ATEN_CPU_CAPABILITY=default"
test-isa: install
	$(BIN)/pip install -q --no-deps --force-reinstall . >/dev/null
	cd tests && for target in $(ISA_TARGETS); do echo "== $$target"; \
		env $$target ../$(BIN)/python -m pytest -p no:cacheprovider -n auto --dist load \
			test_mathlib.py test_low_precision.py test_nonlinearities.py \
			-k "not autocast and (gelu or not test_nonlinearities)" || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info
