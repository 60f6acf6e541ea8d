"""Snakemake's command line as the tests run it: coverage stopped in Snakemake's own process, the
jobs it starts measured (conftest.snakemake_cli()).

make test measures coverage in every Python process the suite starts (``patch = subprocess`` in
pyproject.toml). In Snakemake's own process that traced Snakemake itself, which is not pipeline/:
its imports and the DAG's construction ran about 1.5x slower in each of the suite's Snakemake
runs. The jobs inherit the request (the environment) and are measured as before. The lines of
pipeline/ that Snakemake's process runs (the config's checks, the rules' inputs and params) are run
by unit tests in pytest's own process too; the coverage gate (.ci/coverage_gate.py) fails on any
that no process runs.

    python tests/snakemake_untraced.py <snakemake arguments>
"""

from __future__ import annotations

import sys


def stop_coverage() -> None:
    """Stop the coverage that Python's start-up began in this process, if any."""
    import coverage

    started = coverage.Coverage.current()
    if started is not None:
        started.stop()


if __name__ == "__main__":
    stop_coverage()
    from snakemake.cli import main

    sys.exit(main())
