"""pipeline.dag.target_jobs: the repair of Snakemake's --target-jobs refuses a Snakemake it does not fit."""

import dataclasses

import pytest


def test_the_repair_refuses_dag_settings_without_target_jobs():
    from pipeline.dag.target_jobs import check_snakemake

    @dataclasses.dataclass
    class NoTargetJobs:  # a stand-in for DAGSettings that lost the field
        targets: tuple = ()

    def init(self, workflow):  # the right signature, so only the settings are the problem
        pass

    with pytest.raises(RuntimeError, match=r"cannot repair.*its DAG settings have no target_jobs\)") as err:
        check_snakemake("9.27.1", init, NoTargetJobs)
    assert "version" not in str(err.value) and "workflow first" not in str(err.value)
