"""Run at the start-up of every Python process the suite starts: tests/conftest.py puts this folder
first on PYTHONPATH, which the processes inherit (stages, Snakemake jobs, SLURM job steps), and
Python imports a ``sitecustomize`` module from its path once the site-packages' .pth files have run
(coverage's among them, so its tracer is set). It sets coverage aside while a library is imported
(tests/untraced_imports.py). Nothing is written outside the checkout: a process started without
that PYTHONPATH runs as it would without the tests."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parent.parent / "untraced_imports.py"), run_name="__untraced_imports__")
