# Two commands on a fresh Debian machine (as root):
#   make demo   # install what is needed, run the whole workflow on the embedded dataset
#   make test   # install what is needed (incl. SLURM), run the test suite
# Both are idempotent: a second call skips installed packages and finished jobs.
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=

.PHONY: demo test test-quick coverage setup setup-test lock dag lint tables clean

demo: setup
	snakemake
	@echo; echo "=== results/tables/main.md ==="; cat results/tables/main.md
	@echo; echo "All tables: results/tables/   per-cell outputs: results/cells/<cell>/"

test: setup-test
	python -m pytest -n auto --cov --cov-report= $(PYTEST_ARGS)

# the editing loop: every module's unit tests, not the workflow, SLURM or multi-process ones
# (docs/testing.md); make test runs them all
test-quick: setup-test
	python -m pytest -q -n auto -m "not slow and not slurm and not integration and not cuda" $(PYTEST_ARGS)

# CI, after make test: every line of pipeline/ the suite never ran must be a CUDA-only line of
# .ci/coverage-allowlist.txt (with its reason); prints the coverage figure
coverage: setup-test
	python .ci/coverage_gate.py

setup:
	@bash .ci/setup.sh demo

setup-test:
	@bash .ci/setup.sh test

# requirements.lock from requirements.txt + requirements-test.txt: versions kept where still allowed
# (uv prefers the lock's pins), hashes of every file of each version. ffcv's metadata is built in
# .venv (its setup.py imports numpy, cython and pkgconfig).
lock: setup-test
	uv pip compile requirements.txt requirements-test.txt --generate-hashes --python $(VENV)/bin/python \
	  --no-build-isolation-package ffcv --custom-compile-command "make lock" -o requirements.lock

dag: setup
	snakemake --dag | dot -Tsvg > results/dag.svg

lint: setup-test
	ruff check .
	ruff format --check .
	mypy  # the type checker over pipeline/ ([tool.mypy] in pyproject.toml)
	snakefmt --check Snakefile workflow/rules
	snakemake --lint

tables: setup
	python -m pipeline.tables results

clean:
	rm -rf results/data results/cells results/state results/logs results/benchmarks results/tables results/figures .snakemake
