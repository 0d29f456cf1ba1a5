# Two entry points for a fresh clone (see README):  make reproduce  |  make test
# Each builds .venv on first use: torch is pinned to the CPU wheel first, so that
# resolving the project's range never pulls a multi-GB CUDA build. The `fast` extra
# (numba) makes the fused training engine the default; its kernels are compiled once
# here (numba's disk cache), not in the first run.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TORCH  ?= torch==2.13.0
STAMP   = $(VENV)/.installed

.PHONY: install reproduce test bench lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[probe,dask,test,fast,bench]"
	$(BIN)/python -c "import attnsvm.fused as f; print('fused engine (numba):', 'compiled' if f.warmup() else 'not available')"
	$(BIN)/python -c "import attnsvm.svm.lean as a; print('active-set SVM solver (numba):', 'compiled' if a.warmup() else 'not available')"
	touch $(STAMP)

install: $(STAMP)

reproduce: $(STAMP)
	$(BIN)/attnsvm reproduce $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
