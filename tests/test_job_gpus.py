"""A config whose detection ranks the profile cannot give GPUs for fails while the DAG is built,
naming both keys; a profile without GPU gres (a CPU cluster) runs the ranks on CPUs."""

import pytest
from conftest import hard_run, snakemake_bin

from pipeline.spec.config import ConfigError
from pipeline.spec.job_gpus import check_ranks_fit, gres_gpus


@pytest.mark.parametrize(
    "gres, gpus",
    [("gpu:4", 4), ("gpu:a100:2", 2), ("gpu", 1), ("", None), (None, None), ("shard:2,gpu:8", 8)],
)
def test_gres_gpus(gres, gpus):
    assert gres_gpus(gres) == gpus


def test_ranks_beyond_the_profiles_gpus_fail_naming_both_keys():
    check_ranks_fit("detect", 4, "detect.ranks", {"detect": {"gres": "gpu:4"}})
    check_ranks_fit("detect", 4, "detect.ranks", {"detect": {"gres": ""}})  # CPU ranks
    check_ranks_fit("detect", 4, "detect.ranks", {})  # no profile
    with pytest.raises(ConfigError, match=r"detect\.ranks: 8 ranks .* set-resources\.detect\.gres gives 'gpu:1'"):
        check_ranks_fit("detect", 8, "detect.ranks", {"detect": {"gres": "gpu:1"}})


def test_the_site_profile_refuses_detection_ranks_it_cannot_give(tmp_path):
    cmd = [snakemake_bin(), "-n", "--profile", "profiles/slurm", "--configfile", "workflow/config/presets/tiny.yaml"]
    proc = hard_run([*cmd, "--config", f"results={tmp_path}", "detect={ranks: 4, batch_size: 4}"], timeout=180)
    assert proc.returncode != 0
    assert "detect.ranks: 4 ranks need 4 GPUs" in proc.stdout + proc.stderr
