"""A repair of Snakemake 9.27 for cluster jobs of cells whose id has commas.

A cluster job names the one job it runs with ``--target-jobs rule:cell="K=128,seed=1"``;
Snakemake's parser splits the wildcards at every comma, also inside the quotes the executor
plugin puts around such a value, so the job would run cell ``K=128`` and the outputs the main
workflow waits for would never appear. Installed from the Snakefile; tests/test_grid.py
round-trips the plugin's encoder and Snakemake's parser, so a change of either shows there.
"""

from __future__ import annotations


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
    from snakemake import dag  # type: ignore[import-untyped]

    make = getattr(dag.DAG.__init__, "wrapped", dag.DAG.__init__)  # Snakemake's own, once

    def init(self, workflow, *args, **kwargs):
        settings = workflow.dag_settings
        if settings is not None and settings.target_jobs:
            settings.target_jobs = rejoin_target_wildcards(
                settings.target_jobs, lambda rule: workflow.get_rule(rule).wildcard_names
            )
        make(self, workflow, *args, **kwargs)

    init.wrapped = make  # type: ignore[attr-defined]
    dag.DAG.__init__ = init
