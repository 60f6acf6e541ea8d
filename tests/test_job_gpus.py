"""A config whose detection ranks the profile cannot give GPUs for fails while the DAG is built,
naming both keys; a profile without GPU gres (a CPU cluster) runs the ranks on CPUs."""

import pytest
from conftest import hard_run, snakemake_cli

from pipeline.dag.config import ConfigError
from pipeline.dag.job_gpus import check_ranks_fit, gres_gpus


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


@pytest.mark.integration
def test_probe_and_detection_gpus_follow_their_ranks_unless_a_profile_pins_fewer(tmp_path):
    """The site profile states no gres for probe or detect: their jobs ask for gpu:<ranks> with
    no edit, and start that many processes with torchrun; a gres pinned in set-resources (here
    from the command line) that gives fewer stops the DAG build, naming both keys."""
    cmd = [
        *snakemake_cli(),
        "-n",
        "-p",
        "--profile",
        "profiles/slurm",
        "--configfile",
        "workflow/config/presets/tiny.yaml",
    ]
    cmd += ["--config", f"results={tmp_path}", "detect={ranks: 4, batch_size: 4}"]
    cmd += ["probe={mode: augmented, ranks: 2, batch_size: 32}"]
    proc = hard_run(cmd, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    blocks = proc.stdout.split("\nrule ")
    detect = [b for b in blocks if b.startswith("detect:")]
    probe = [b for b in blocks if b.startswith("probe:")]
    assert detect and all("gres=gpu:4," in b for b in detect)
    assert probe and all("gres=gpu:2," in b for b in probe)
    torchrun = "-m torch.distributed.run --standalone --nproc-per-node {} -m pipeline.{}"
    assert all(torchrun.format(2, "probe") in b for b in probe)
    assert all(torchrun.format(4, "detect") in b for b in detect)
    for rule, key, ranks in (("probe", "probe.ranks", 2), ("detect", "detect.ranks", 4)):
        proc = hard_run([*cmd, "--set-resources", f"{rule}:gres=gpu:1"], timeout=180)
        assert proc.returncode != 0
        assert f"{key}: {ranks} ranks need {ranks} GPUs" in proc.stdout + proc.stderr
        assert f"set-resources.{rule}.gres gives 'gpu:1'" in proc.stdout + proc.stderr
