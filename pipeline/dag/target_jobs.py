"""A repair of Snakemake 9.27 for cluster jobs of cells whose id has commas.

A cluster job names the one job it runs with ``--target-jobs rule:cell="K=128,seed=1"``;
Snakemake's parser splits the wildcards at every comma, also inside the quotes the executor
plugin puts around such a value, so the job would run cell ``K=128`` and the outputs the main
workflow waits for would never appear. Installed from the Snakefile; tests/test_grid.py
round-trips the plugin's encoder and Snakemake's parser, so a change of either shows there;
check_snakemake refuses, loudly, a Snakemake where the repair would not take hold (a silent
miss would run cell ``K=128`` for ``K=128,seed=1``); tests/test_slurm_grid.py runs comma cells
as real cluster jobs.
"""

from __future__ import annotations

import dataclasses
import inspect

SNAKEMAKE_MAJOR = 9  # requirements.txt: snakemake>=9.0,<10; the repair was written against 9.27


def rejoin_target_wildcards(specs, wildcard_names) -> list:
    """Target jobs (``--target-jobs``, how a cluster job names the one job it runs) with the cell
    ids put together again. Snakemake 9.27's parser splits a job's wildcards at every comma,
    also inside the quotes the executor plugins put around a value that has commas, so a cluster
    job of cell ``K=128,seed=1`` would run cell ``K=128`` (and its outputs would never appear).
    A piece whose key is not a wildcard of the rule (``wildcard_names(rule)``) belongs to the
    value before it. ``specs``: Snakemake's TargetSpec tuples (rulename, wildcards_dict)."""
    rejoined = []
    for spec in specs:
        names, wildcards, last = set(wildcard_names(spec.rulename)), {}, None
        for key, value in spec.wildcards_dict.items():
            if key in names or last is None:
                wildcards[key], last = value, key
            else:
                wildcards[last] += f",{key}={value}"
        rejoined.append(type(spec)(spec.rulename, wildcards))
    return rejoined


def rejoin_cells_in_cluster_jobs() -> None:
    """Make Snakemake's DAG rejoin the cell ids of its target jobs (rejoin_target_wildcards).
    Called from the Snakefile: the DAG settings that hold the target jobs are attached to the
    workflow only after the Snakefile is read, so the repair runs where the DAG is made."""
    import snakemake  # type: ignore[import-untyped]
    from snakemake import dag
    from snakemake.settings.types import DAGSettings  # type: ignore[import-untyped]

    make = getattr(dag.DAG.__init__, "wrapped", dag.DAG.__init__)  # Snakemake's own, once
    check_snakemake(snakemake.__version__, make, DAGSettings)

    def init(self, workflow, *args, **kwargs):
        settings = workflow.dag_settings
        if settings is not None and settings.target_jobs:
            settings.target_jobs = rejoin_target_wildcards(
                settings.target_jobs, lambda rule: workflow.get_rule(rule).wildcard_names
            )
        make(self, workflow, *args, **kwargs)

    init.wrapped = make  # type: ignore[attr-defined]
    dag.DAG.__init__ = init


def check_snakemake(version: str, dag_init, dag_settings) -> None:
    """Raise unless the repair takes hold in this Snakemake: major version SNAKEMAKE_MAJOR, a
    ``DAG.__init__(self, workflow, ...)``, and DAG settings that hold ``target_jobs``."""
    problems = []
    if version.split(".")[0] != str(SNAKEMAKE_MAJOR):
        problems.append(f"version {version}, not {SNAKEMAKE_MAJOR}.x")
    if list(inspect.signature(dag_init).parameters)[:2] != ["self", "workflow"]:
        problems.append(f"DAG.__init__{inspect.signature(dag_init)} does not take the workflow first")
    if "target_jobs" not in {f.name for f in dataclasses.fields(dag_settings)}:
        problems.append("its DAG settings have no target_jobs")
    if problems:
        raise RuntimeError(
            "pipeline.dag.target_jobs cannot repair this Snakemake's --target-jobs parsing ("
            + "; ".join(problems)
            + "): cluster jobs of cells with commas in their id would run another cell. "
            f"Install snakemake {SNAKEMAKE_MAJOR}.x (requirements.txt) or adapt the repair."
        )
