"""The workflow on a real SLURM cluster: two slurmd "nodes" (n1, n2) on this machine
(tests/slurm_cluster.py), started once for these tests and stopped afterwards.

- the tiny preset end to end through profiles/slurm-test, pretraining on 2 nodes (2 gloo ranks);
- the submitit launcher: a 2-node pretraining submitted, interrupted, requeued and finished;
- Snakemake + srun: a 2-node pretraining interrupted (SIGUSR1), requeued by itself, resumed, and
  bit-identical to an uninterrupted run;
- a failing job fails its Snakemake job, with the error in its log, and nothing hangs.

Every call has a hard timeout: on a cluster the failure mode is a hang. Runs as root only
(daemons, /etc/slurm/slurm.conf); skipped elsewhere, but fails in CI (CI=true).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster
import torch
from conftest import REPO, require, snakemake_bin

from pipeline.spec.config import merge

pytestmark = pytest.mark.slurm

TINY = "workflow/config/presets/tiny.yaml"
# A pretraining that resumes bit-exactly (device crops, state after every step), 2 ranks x 2
# images per step: 80 images = 20 steps per epoch, so the ranks' preemption check (every 10
# steps) comes mid-epoch too.
EXACT = {
    "data": {"crop": "device", "workers": 1},
    "pretrain": {"epochs": 2, "batch_size": 4, "K": 64, "checkpoint_every": 1, "knn_every": 0, "threads": 1, "seed": 5},
}
BAD = {"pretrain": {"batch_size": 9, "K": 63}}  # valid for the workflow, not for 2 ranks
RANK_START = re.compile(r"\[pretrain\] rank (\d+)/(\d+) on (\S+): method=")
RANK_END = re.compile(r"\[pretrain\] rank (\d+)/(\d+) on (\S+): queue checksum (\S+)")


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def cluster():
    missing = slurm_cluster.missing_prerequisites()
    require(not missing, "the SLURM test cluster needs " + ", ".join(missing))
    c = slurm_cluster.Cluster()
    try:
        c.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        pytest.fail(f"the SLURM test cluster did not start: {err}")
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def no_leftover_jobs(request):
    """A test that failed or timed out leaves no job behind for the next one."""
    yield
    if "cluster" in request.fixturenames:
        slurm_cluster.cancel_all()


@pytest.fixture(scope="session")
def exact_results(synthetic_small, ffcv_small, tmp_path_factory) -> Path:
    """A results folder whose dataset is already there (synthetic + FFCV), so that a target
    in it runs the pretraining job only."""
    base = tmp_path_factory.mktemp("exact")
    data = base / "data"
    shutil.copytree(synthetic_small, data / "synthetic")
    time.sleep(1)  # the .beton files are newer than the images they come from
    shutil.copytree(ffcv_small, data / "ffcv")
    (base / "overlay.yaml").write_text(json.dumps(EXACT))
    return base


def results_with_data(exact_results: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copytree(exact_results / "data", dest / "data", copy_function=shutil.copy2)
    return dest


@pytest.fixture(scope="session")
def reference(cluster, ffcv_small, tmp_path_factory) -> dict:
    """The same pretraining uninterrupted: 2 ranks on n1, n2 with srun (no Snakemake)."""
    out = tmp_path_factory.mktemp("reference")
    cmd = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--partition=gpu",
        "--export=ALL,SUBMITIT_EXECUTOR=slurm",
        sys.executable,
        "-m",
        "pipeline.pretrain",
        "--config",
        json.dumps(yaml_merge_tiny(EXACT)),
        "--data",
        str(ffcv_small),
        "--out",
        str(out / "run"),
        "--state",
        str(out / "state"),
        "--no-progress",
    ]
    proc = hard_run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return torch.load(out / "run" / "checkpoint.pt", weights_only=True)


# --- helpers ----------------------------------------------------------------------------------
def hard_run(cmd, timeout: float) -> subprocess.CompletedProcess:
    """Run with `timeout -s KILL`: a hang ends as a failure, not as a stuck test run."""
    return subprocess.run(
        ["timeout", "-s", "KILL", str(int(timeout)), *map(str, cmd)], cwd=REPO, capture_output=True, text=True
    )


def yaml_merge_tiny(overlay: dict) -> dict:
    """The data + pretrain sections a stage gets: config.yaml < tiny preset < overlay."""
    import yaml

    cfg = yaml.safe_load((REPO / "workflow/config/config.yaml").read_text())
    for layer in (yaml.safe_load((REPO / TINY).read_text()), overlay):
        cfg = merge(cfg, layer)
    return {"data": cfg["data"], "pretrain": cfg["pretrain"]}


def base_cells_only(folder: Path, overlay: dict) -> Path:
    """A config file that folds the tiny grid's one-at-a-time sweeps into the base cell (a sweep
    value equal to the base's is the base cell): cells base and method=random, every stage."""
    p = yaml_merge_tiny(overlay)["pretrain"]
    path = folder / "base_cells_only.yaml"
    path.write_text(
        json.dumps({"grid": {"one_at_a_time": {"K": [p["K"]], "m": [p["m"]], "shuffle_bn": [p["shuffle_bn"]]}}})
    )
    return path


def snakemake_cmd(results: Path, *targets, configfiles=()) -> list[str]:
    return [
        snakemake_bin(),
        "--profile",
        "profiles/slurm-test",
        "--configfile",
        TINY,
        *map(str, configfiles),
        "--config",
        f"results={results}",
        "--slurm-logdir",
        str(results.parent / "slurm_logs"),
        *map(str, targets),
    ]


def ranks(log: str) -> tuple[list, list]:
    return RANK_START.findall(log), RANK_END.findall(log)


def assert_two_nodes(log: str) -> None:
    """World size 2, rank 0 and rank 1 on different nodes, identical queues at the end (a log
    may hold several starts of a rank: the runs before a requeue)."""
    starts, ends = ranks(log)
    assert starts and {w for _, w, _ in starts} == {"2"}, log[-3000:]
    hosts = {r: h for r, _, h in starts}
    assert sorted(hosts) == ["0", "1"] and set(hosts.values()) == {"n1", "n2"}, starts
    assert sorted((r, w) for r, w, _, _ in ends) == [("0", "2"), ("1", "2")], log[-3000:]
    assert {host for _, _, host, _ in ends} == {"n1", "n2"}
    assert len({checksum for *_, checksum in ends}) == 1, f"queues differ between ranks: {ends}"


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs from the uninterrupted run"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a["log"]) == strip(b["log"])


def interrupt_when_training(
    results: Path, proc: subprocess.Popen, output: Path, signal_name: str, timeout: float = 300
) -> str:
    """Once the run has written its first resume state, send ``signal_name`` to the job's ranks."""
    state = results / "state" / "base" / "last.pt"
    deadline = time.time() + timeout
    while not state.exists():
        assert proc.poll() is None, f"snakemake ended early:\n{output.read_text()[-3000:]}"
        assert time.time() < deadline, f"no resume state after {timeout} s:\n{output.read_text()[-3000:]}"
        time.sleep(0.2)
    job = running_job()
    subprocess.run(["scancel", f"--signal={signal_name}", job], check=True, timeout=30)
    return job


def running_job() -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i %D"], capture_output=True, text=True, timeout=30
    ).stdout.split("\n")
    two_node = [line.split()[0] for line in out if line.split()[1:] == ["2"]]
    assert len(two_node) == 1, f"expected one running 2-node job: {out}"
    return two_node[0]


def restarts(job: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"Restarts=(\d+)", out)
    return int(found.group(1)) if found else -1


def run_interrupted(results: Path, signal_name: str, configfiles, timeout: float) -> tuple[str, str, str]:
    """Snakemake (slurm-test profile) makes results/cells/base/pretrain; the job is signalled
    once it trains. Returns (snakemake output, the rule's log, the SLURM job id)."""
    target = results / "cells" / "base" / "pretrain" / "checkpoint.pt"
    output = results.parent / "snakemake.out"
    cmd = ["timeout", "-s", "KILL", str(int(timeout)), *snakemake_cmd(results, target, configfiles=configfiles)]
    with output.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            job = interrupt_when_training(results, proc, output, signal_name)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = output.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text, (results / "logs" / "pretrain" / "base.log").read_text(), job


# --- tests ------------------------------------------------------------------------------------
def test_profiles_parse():
    """profiles/slurm (the site template) and profiles/slurm-test build the DAG (no cluster needed)."""
    for profile in ("profiles/slurm", "profiles/slurm-test"):
        proc = hard_run(
            [
                snakemake_bin(),
                "--profile",
                profile,
                "--configfile",
                TINY,
                "--config",
                "results=/tmp/moco-dry-run",
                "-n",
                "-p",
            ],
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "srun --nodes=" in proc.stdout + proc.stderr  # the pretrain jobs' explicit geometry


@pytest.mark.timeout(600)
def test_tiny_workflow_with_two_node_pretraining(cluster, tmp_path):
    """profiles/slurm-test, tiny preset: every rule a SLURM job; each pretraining one job on
    n1 and n2 with one gloo rank on each (srun inside the job); identical queues at the end."""
    results = tmp_path / "results"
    proc = hard_run(snakemake_cmd(results, configfiles=[base_cells_only(tmp_path, {})]), timeout=560)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:] + cluster.logs()
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", out)
    rules = sorted({re.search(r"rule_(\w+)", log).group(1) for _, log in submitted})
    assert {"synthetic", "convert", "pretrain", "pretrain_random_init", "probe", "detect", "tables"} <= set(rules), (
        rules
    )
    cells = sorted(p.name for p in (results / "cells").iterdir())
    assert "base" in cells and "method=random" in cells
    for cell in cells:
        assert (results / "cells" / cell / "probe.json").is_file()
    assert (results / "tables" / "main.md").is_file()
    for cell in cells:
        log = (results / "logs" / "pretrain" / f"{cell}.log").read_text()
        if cell == "method=random":  # no training: one process in a small CPU job of its own
            assert len(ranks(log)[0]) == 1 and "rank 0/1" in log, log[-2000:]
        else:
            assert_two_nodes(log)


@pytest.mark.timeout(480)
def test_submitit_launcher_requeues_and_resumes(cluster, exact_results, reference, tmp_path):
    """launch.launcher=submitit: the rule (local) submits a 2-node job through submitit; SIGUSR2
    (as before a time limit) -> state saved, checkpoint(), requeue -> resumed, same weights."""
    results = results_with_data(exact_results, tmp_path / "results")
    launch = tmp_path / "launch.yaml"
    launch.write_text(
        json.dumps(
            {
                "launch": {
                    "launcher": "submitit",
                    "slurm": {
                        "nodes": 2,
                        "tasks_per_node": 1,
                        "cpus_per_task": 1,
                        "timeout_min": 10,
                        "partition": "gpu",
                        "signal_delay_s": 30,
                        "max_requeues": 2,
                    },
                }
            }
        )
    )
    out, log, job = run_interrupted(results, "USR2", [exact_results / "overlay.yaml", launch], timeout=420)
    assert "submitted slurm job" in log and "checkpoint: resubmitting" in log, log[-4000:]
    assert "Requeued job" in log, log[-4000:]
    assert "resumed from" in log, log[-4000:]
    assert restarts(job) >= 1
    assert_two_nodes(log)
    assert_same_weights(torch.load(results / "cells/base/pretrain/checkpoint.pt", weights_only=True), reference)


@pytest.mark.timeout(480)
def test_interrupted_pretraining_requeues_and_resumes_exactly(cluster, exact_results, reference, tmp_path):
    """launcher direct: SIGUSR1 to the job's ranks -> state saved, `scontrol requeue` -> the
    same SLURM job reruns the rule, which resumes; the result equals the uninterrupted run."""
    results = results_with_data(exact_results, tmp_path / "results")
    out, log, job = run_interrupted(results, "USR1", [exact_results / "overlay.yaml"], timeout=420)
    assert re.search(r"resumed from \S+ at epoch \d+, step \d+", log), log[-4000:]
    assert restarts(job) >= 1, "the job was not requeued"
    assert out.count("has been submitted with SLURM jobid") == 1  # one job: requeued, not resubmitted
    assert_two_nodes(log)
    assert_same_weights(torch.load(results / "cells/base/pretrain/checkpoint.pt", weights_only=True), reference)


@pytest.mark.timeout(300)
def test_failing_job_fails_the_workflow(cluster, exact_results, tmp_path):
    """A config error that only shows with 2 ranks: the job fails, Snakemake reports it with
    the job's log, and returns."""
    results = results_with_data(exact_results, tmp_path / "results")
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(BAD))
    target = results / "cells" / "base" / "pretrain" / "checkpoint.pt"
    only_base = base_cells_only(tmp_path, merge(EXACT, BAD))  # the tiny grid's K=128 needs an even batch
    proc = hard_run(
        snakemake_cmd(results, target, configfiles=[exact_results / "overlay.yaml", bad, only_base]), timeout=240
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, -9, 137), out[-4000:]  # failed, not killed by the timeout
    assert "Error in rule pretrain" in out, out[-4000:]
    why = "pretrain.batch_size=9 is not divisible by the world size 2"
    assert why in (results / "logs" / "pretrain" / "base.log").read_text()
    assert why in out  # show-failed-logs: the log is in Snakemake's output
    assert not target.exists()
