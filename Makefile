# Entry points for a fresh clone (see README):  make reproduce  |  make test
# Each target builds .venv on first use and installs only what it needs: the core (torch
# pinned to its CPU build first, so that resolving the project's range never pulls a
# multi-GB CUDA build; then attnsvm with numba, whose kernels `attnsvm warmup` compiles
# once here into numba's disk cache, not in the first run), plus the extras of that target (reproduce:
# transformers, for study-heads; test: the
# test tools, transformers for the probe tests and dask for the sweep tests; bench: the
# benchmark peers; docs: mkdocs; dist: build and twine). Every step prints its title and
# its duration.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PIP     = $(BIN)/python -m pip
TORCH  ?= torch==2.13.0
STEP    = @bash tools/step.sh
CORE    = $(VENV)/.core

.PHONY: install reproduce test bench docs dist lint ci clean
.PRECIOUS: $(VENV)/.for-%

$(CORE): pyproject.toml Makefile
	$(STEP) "create the virtual environment $(VENV)" $(PYTHON) -m venv $(VENV)
	$(STEP) "upgrade pip" $(PIP) install --upgrade pip
	$(STEP) "install PyTorch, CPU build ($(TORCH))" $(PIP) install "$(TORCH)"
	$(STEP) "install attnsvm and its dependencies (editable)" $(PIP) install -e .
	$(STEP) "compile the numba kernels (attnsvm warmup: training engine, SVM solvers; cached on disk)" \
	  $(BIN)/attnsvm warmup --progress
	@rm -f $(VENV)/.for-*
	@touch $(CORE)

# the extras of pyproject.toml each target needs beyond the core (reproduce: transformers,
# for the study of trained decoder heads in the default run)
EXTRAS_reproduce = probe
EXTRAS_test  = test,probe,dask
EXTRAS_bench = bench
EXTRAS_docs  = docs
EXTRAS_dist  = dist,test

# $(VENV)/.for-TARGET: the extras of TARGET, installed once
$(VENV)/.for-%: $(CORE)
	$(STEP) "install the extras for make $* ($(EXTRAS_$*))" $(PIP) install -e ".[$(EXTRAS_$*)]"
	@touch $@

install: $(CORE)

reproduce: $(VENV)/.for-reproduce
	$(STEP) "attnsvm reproduce $(ARGS)" $(BIN)/attnsvm reproduce $(ARGS)

test: $(VENV)/.for-test
	$(STEP) "run the test suite" $(BIN)/python -m pytest -q $(ARGS)

bench: $(VENV)/.for-bench
	$(STEP) "run the benchmarks" $(BIN)/python benchmarks/run_all.py $(ARGS)

# the documentation site, warnings as errors (site/ holds the result)
docs: $(VENV)/.for-docs
	$(STEP) "build the documentation site (mkdocs --strict)" $(BIN)/mkdocs build --strict --quiet

# the sdist and the wheel, their metadata checked, and the wheel tested as installed
dist: $(VENV)/.for-dist
	@rm -rf dist
	$(STEP) "build the sdist and the wheel" $(BIN)/python -m build --no-isolation --outdir dist .
	$(STEP) "check their metadata (twine check --strict)" $(BIN)/twine check --strict dist/*
	$(STEP) "test the wheel installed in a fresh environment" \
	  env ATTNSVM_WHEEL="$$(ls dist/*.whl)" $(BIN)/python -m pytest -q -m installed tests/test_installed.py

lint: $(VENV)/.for-test
	$(STEP) "ruff" $(BIN)/ruff check src tests benchmarks

# what .ci/run runs
ci: test docs dist

clean:
	rm -rf $(VENV) build dist site *.egg-info src/*.egg-info .pytest_cache
