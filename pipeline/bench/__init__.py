"""Benchmarks: ``python -m pipeline.bench <name> [args]`` runs ``pipeline/bench/<name>.py``.

Each benchmark is a module with ``main(argv) -> dict`` that prints its result and writes it
as JSON to ``bench/out/<name>.json`` (pipeline.bench.timing.write). Adding a benchmark means
adding a module; nothing here needs to change.
"""

from __future__ import annotations

import importlib
import pkgutil

HELPERS = {"timing"}  # modules of this package that are not benchmarks


def available() -> list[str]:
    """Names of the benchmark modules (those with a ``main``)."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in HELPERS:
            continue
        names.append(info.name)
    return sorted(names)


def load(name: str):
    """The benchmark module ``name``; ValueError naming the available ones otherwise."""
    if name not in available():
        raise ValueError(f"unknown benchmark '{name}' (available: {', '.join(available()) or 'none'})")
    module = importlib.import_module(f"{__name__}.{name}")
    if not callable(getattr(module, "main", None)):
        raise ValueError(f"pipeline/bench/{name}.py has no main(argv)")
    return module
