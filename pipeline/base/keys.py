"""How a config key is declared: its default, what it means, its JSON Schema rules and what it
sets. pipeline.dag.sections and pipeline.methods.section declare the sections with these, and a
method's folder its own keys (its keys.py), which the Pretrain section holds beside the shared
ones.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

# What a key sets (its "sets"); unmarked keys determine their stage's result. A rule's params,
# which Snakemake compares to decide a rerun, and a pretraining run's fingerprint, which decides
# a resume, hold the result keys only (pipeline.dag.config.result_part).
RUNTIME = "runtime"  # resources, logging or monitoring: never changes a result's meaning
JOBS = "jobs"  # which jobs exist (e.g. detect.trials), not what one of them computes
INIT = "init"  # pretrain: with the seed, all an untrained (random-init) network depends on
PLAN = "plan"  # read while the DAG is built to set other keys (e.g. epochs), never by a stage


def key(
    default: Any = None,
    doc: str = "",
    *,
    sets: str | None = None,
    unless: Callable | None = None,
    factory: Callable | None = None,
    **rules: Any,
) -> Any:
    """One config key: its default (``factory`` for a nested section or a dict), what it means
    (the schema's description) and JSON Schema ``rules`` on its value (a callable rule is called
    when the schema is made: a list another module keeps, e.g. the registered methods). ``sets``:
    what it determines (above); ``unless(section)``: where a RUNTIME key does change the result."""
    metadata = {"doc": doc, "rules": rules, "sets": sets, "unless": unless}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def runtime(default: Any, doc: str = "", unless: Callable | None = None, **rules: Any) -> Any:
    """A RUNTIME key. Thread and worker counts change float rounding only (the order of summed
    terms, measured in docs/methods.md, "A run resumes only from its own state"): the same
    experiment, as on a GPU run to run."""
    return key(default, doc, sets=RUNTIME, unless=unless, **rules)


def like_pretrain() -> Any:
    """A grid.supervised key: the same-named pretrain key's rules, or null (the base cell's value)."""
    return field(default=None, metadata={"like": "pretrain"})


SEED: dict[str, Any] = {"minimum": 0, "maximum": 2**31 - 1}
THREADS: dict[str, Any] = {"minimum": 1, "maximum": 1024}
WORKERS: dict[str, Any] = {"minimum": 1, "maximum": 256}
COUNT: dict[str, Any] = {"minimum": 1, "maximum": 100_000}  # images, epochs, proposals: a 1e12 is a typo
EPOCHS: dict[str, Any] = {"minimum": 1, "maximum": 100_000}
BATCH: dict[str, Any] = {"minimum": 1, "maximum": 2**20}
POSITIVE: dict[str, Any] = {"exclusiveMinimum": 0}
NON_NEGATIVE: dict[str, Any] = {"minimum": 0}
CHECKPOINT_EVERY: dict[str, Any] = {"minimum": 0, "maximum": 10**9}
