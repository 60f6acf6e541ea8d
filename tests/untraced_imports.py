"""Coverage pauses while a library outside pipeline/ is imported for the first time, in every
process the suite starts (tests/conftest.py installs it).

make test measures pipeline/ in every Python process it starts. Under Python 3.11 coverage's tracer
sees every Python call of a process, not only pipeline/'s, and importing the libraries a stage
uses is most of a short process's calls: on the Intel Xeon with AMX `import pipeline.pretrain` took
1.9 s untraced and 2.4 s traced, `import torch, ffcv` 4.7 s and 6.3 s. The lines coverage records
are pipeline/'s, so a first import of another library runs with the tracer set aside; the import of
a pipeline module, even one a paused import reaches, is traced as before, and so is every call
after the import (docs/testing.md; measured: docs/studies/2026-12-06-suite-time.md).

A process started by a test runs this file at start-up from tests/startup/sitecustomize.py, which
Python finds on the PYTHONPATH that tests/conftest.py sets (install_startup_hook()); other runs of
the same environment do not change, and nothing is written outside the checkout.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

STARTUP = Path(__file__).resolve().parent / "startup"  # holds sitecustomize.py
MEASURED = "pipeline"  # coverage's source (pyproject.toml [tool.coverage.run])


def untraced_import(measured: str, original: Callable) -> Callable:
    """An `__import__` that calls `original` with the tracer set aside while a module outside the
    package `measured` is imported for the first time."""
    thread = threading.local()  # .set_aside: the thread's tracer while such an import runs

    def is_measured(name: str, globals: dict | None, level: int) -> bool:
        if level:  # a relative import: the package it is relative to
            name = (globals or {}).get("__package__") or ""
        return name.partition(".")[0] == measured

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        set_aside = getattr(thread, "set_aside", None)
        if is_measured(name, globals, level):
            if set_aside is None or sys.gettrace() is not None:
                return original(name, globals, locals, fromlist, level)
            # a library's import reaches a measured module: trace it as any other
            sys.settrace(set_aside)
            try:
                return original(name, globals, locals, fromlist, level)
            finally:
                sys.settrace(None)
        tracer = sys.gettrace()
        if tracer is None or name in sys.modules:
            return original(name, globals, locals, fromlist, level)
        thread.set_aside = tracer
        sys.settrace(None)
        try:
            return original(name, globals, locals, fromlist, level)
        finally:
            thread.set_aside = set_aside  # None, or that of the library import around a measured one
            sys.settrace(tracer)

    import_.original = original  # type: ignore[attr-defined]
    return import_


def install() -> None:
    """Route this process's imports through `untraced_import` for pipeline/ (once: sitecustomize.py
    may have done it at start-up, from another copy of this module)."""
    if not hasattr(builtins.__import__, "original"):
        builtins.__import__ = untraced_import(MEASURED, builtins.__import__)


def install_startup_hook() -> None:
    """Put tests/startup first on PYTHONPATH, so that every process started from here runs its
    sitecustomize.py, which installs the same wrapper."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(STARTUP) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP), *filter(None, paths)])


if __name__ == "__untraced_imports__":  # run by tests/startup/sitecustomize.py at a process's start-up
    install()
