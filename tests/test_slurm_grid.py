"""A grid of 8 tiny cells (2 seeds x 2 K x 2 m) through the site profile (tests/site_profile.py;
each pretraining one process, not srun) on the local two-node SLURM cluster, with two faults
during the run:

- one pretraining job cancelled mid-run (``scancel``: SIGTERM, the state is saved, the job ends
  CANCELLED): Snakemake's retry (restart-times) submits it again and it resumes;
- node n2 taken down (``scontrol update nodename=n2 state=down``) while a pretraining runs on
  it: SLURM requeues the job (--requeue), it resumes; then n2 is brought back (state=resume).

The workflow finishes, both cells resume from results/state/<cell>/last.pt (their logs say so),
nothing that had finished runs again (one submission per job but the cancelled one; outputs
written before the faults keep their mtimes), and the tables hold every cell, trained to the end. Faults are
triggered by events (a state file, squeue's view), never by sleeps. The run's figures (jobs
submitted per minute, slurmctld's CPU time: pipeline.bench.slurm) are printed and written to
the test's folder.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import site_profile
from conftest import REPO

from pipeline.bench import slurm as bench_slurm

pytestmark = pytest.mark.slurm

TINY = "workflow/config/presets/tiny.yaml"
# 8 cells: what the test shows (cell ids of three keys, a cancelled and a lost job resumed, nothing
# submitted or written twice) needs several cells running at once on both nodes, and two values of
# each key, not more; each cell is two jobs whose cost is their processes' start (30 cells: 756 s
# of a 59-min suite on the AVX2 EPYC; 12 cells: 408 s; a third m proved nothing the second did not)
SEEDS, K, M = 2, [128, 256], [0.0, 0.99]  # the base cell (K 256, m 0.99) among them
CELLS = SEEDS * len(K) * len(M)
# Smaller than the tiny preset: 80 training images, 2 steps of 32 per epoch, 5 epochs, the resume
# state after every step (the faults land mid-run), no kNN monitor, a 1-epoch probe, no
# detection; torchvision's loader (no FFCV compilation per job).
GRID = {
    "dataset": {"synthetic": {"train_per_class": 8, "val_per_class": 4}},
    "data": {"loader": "torchvision"},
    "pretrain": {"epochs": 5, "batch_size": 32, "width": 4, "checkpoint_every": 1, "knn_every": 0},
    "probe": {"epochs": 1},
    "detect": {"enabled": False},
    "grid": {
        "seeds": SEEDS,
        "only": None,
        "one_at_a_time": {"K": [256], "m": [0.99], "shuffle_bn": [True]},  # = the base cell: no sweeps
        "product": {"K": K, "m": M},
        "cells": [],  # config.yaml's MoCo v3 and ViT cells: not this test's
        "baselines": [],
    },
}
# a hang guard, not a speed target: the grid's cost is its jobs' process starts (30 cells on an
# AVX2-only EPYC's 2 cores took 1,027 s alone, 24 min while a second pytest process ran other tests)
HANG_AFTER_S = 1800
RESUMED = re.compile(r"resumed from (\S+) at epoch (\d+), step (\d+)")


def running_jobs() -> list[dict]:
    """{"job", "rule", "cell", "node"} of every running job (the plugin's comment names rule and cell)."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k|%N"], capture_output=True, text=True, timeout=30
    ).stdout
    jobs = []
    for line in out.splitlines():
        job, comment, node = line.split("|")
        named = re.fullmatch(r"rule_(\w+?)(?:_wildcards_(.*))?", comment)
        if named:
            jobs.append({"job": job, "rule": named[1], "cell": named[2], "node": node})
    return jobs


def squeue_pretraining() -> list[dict]:
    return [job for job in running_jobs() if job["rule"] == "pretrain"]


def wait_for(event, what: str, proc: subprocess.Popen, output: Path, timeout: float = 300):
    """Poll until event() returns something truthy; fail if Snakemake ends first or on timeout."""
    deadline = time.time() + timeout
    while True:
        found = event()
        if found:
            return found
        assert proc.poll() is None, f"snakemake ended before {what}:\n{output.read_text()[-3000:]}"
        assert time.time() < deadline, f"no {what} after {timeout} s:\n{output.read_text()[-3000:]}"
        time.sleep(0.2)


def training_mid_run(results: Path, node: str | None = None, besides: str | None = None):
    """A running pretraining (on ``node``) whose resume state exists and which has no output
    yet: it is past its first step and not finished."""

    def event():
        for job in squeue_pretraining():
            cell_dir = results / "cells" / job["cell"] / "pretrain"
            if job["cell"] == besides or (node and job["node"] != node):
                continue
            if (results / "state" / job["cell"] / "last.pt").exists() and not (cell_dir / "checkpoint.pt").exists():
                return job
        return None

    return event


JOB_RULE = re.compile(r"^(?:local)?rule (\w+):$")
JOB_ID = re.compile(r"^    jobid: (\d+)$")
JOB_CELL = re.compile(r"^    wildcards: cell=(\S+?)(?:, |$)")
JOB_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


def finished_outputs(results: Path, snakemake_out: Path) -> dict[Path, int]:
    """Every pretraining checkpoint and probe result whose job Snakemake has logged as finished,
    with its mtime (ns). Not the jobs SLURM has ended: Snakemake touches a job's outputs when it
    registers the job's end (seen: a checkpoint's mtime moved 21 s after its job had ended)."""
    rule = job = None
    cells: dict[str, tuple[str, str]] = {}
    finished = set()
    for line in snakemake_out.read_text().splitlines():
        if m := JOB_RULE.match(line):
            rule, job = m[1], None
        elif m := JOB_ID.match(line):
            job = m[1]
        elif (m := JOB_CELL.match(line)) and rule and job:
            cells[job] = (rule, m[1])
        elif m := JOB_FINISHED.match(line):
            finished.add(cells.get(m[1]))
    found = [
        results / "cells" / cell / "pretrain" / "checkpoint.pt"
        for rule, cell in filter(None, finished)
        if rule == "pretrain"
    ]
    found += [results / "cells" / cell / "probe.json" for rule, cell in filter(None, finished) if rule == "probe"]
    return {path: path.stat().st_mtime_ns for path in found}


def node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True, timeout=30).stdout


def scontrol_node(node: str, *settings: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", *settings], check=True, timeout=30)


def kill_processes_of(folder: Path) -> None:
    """Processes whose command line names this test's folder: a job step's Snakemake can outlive
    its job when the node goes down under it (seen here with proctrack/linuxproc)."""
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            mentions = str(folder).encode() in (proc_dir / "cmdline").read_bytes()
            if mentions and int(proc_dir.name) != os.getpid():
                os.kill(int(proc_dir.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def bring_back(node: str) -> None:
    """state=resume, unless the node is up already: the test cluster's ReturnToService=2 returns a
    down node to service as soon as its slurmd answers (SLURM then refuses the resume)."""
    proc = subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0 or "down" not in node_state(node), proc.stderr


@pytest.mark.timeout(HANG_AFTER_S + 120)
def test_grid_of_8_cells_survives_a_cancelled_job_and_a_lost_node(cluster, tmp_path):
    # each pretraining one process in a one-core job: a job's cost here is its processes' start
    # (Python, torch), and the 2-rank, 2-node geometry is test_slurm.py's site run
    profile = site_profile.derive(tmp_path / "profile", one_process=True)
    bin_dir, calls_log = site_profile.sbatch_wrapper(tmp_path, sys.executable)
    config = tmp_path / "grid.yaml"
    config.write_text(json.dumps(GRID))
    results, output = tmp_path / "results", tmp_path / "snakemake.out"
    cmd = [
        *("timeout", "-s", "KILL", str(HANG_AFTER_S)),
        *site_profile.snakemake_command(),
        *("--profile", profile, "--configfile", TINY, config),
        *("--config", f"results={results}", "--slurm-logdir", tmp_path / "slurm_logs"),
    ]
    controller = cluster.procs["slurmctld"].pid
    cpu_before, t0 = bench_slurm.cpu_seconds(controller), time.time()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with output.open("w") as out:
        proc = subprocess.Popen(
            list(map(str, cmd)), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            # fault 1: a pretraining cancelled mid-run
            cancelled = wait_for(training_mid_run(results), "a pretraining mid-run", proc, output)
            before_cancel = finished_outputs(results, output)
            subprocess.run(["scancel", cancelled["job"]], check=True, timeout=30)
            # fault 2: n2 lost while another pretraining runs there; back once its job left it
            lost = wait_for(
                training_mid_run(results, node="n2", besides=cancelled["cell"]), "a pretraining on n2", proc, output
            )
            before_down = finished_outputs(results, output)
            scontrol_node("n2", "state=down", "reason=test")
            wait_for(
                lambda: all(j["job"] != lost["job"] for j in squeue_pretraining() if j["node"] == "n2"),
                "the lost job off n2",
                proc,
                output,
            )
            bring_back("n2")
            proc.wait(timeout=HANG_AFTER_S)
        finally:
            if proc.poll() is None:  # timeout and snakemake under it
                os.killpg(proc.pid, signal.SIGKILL)
            bring_back("n2")
            kill_processes_of(tmp_path)
    wall = time.time() - t0
    text = output.read_text()
    assert proc.returncode == 0, text[-5000:] + cluster.logs()

    # the figures (no assertion on them: a shared machine's timings)
    calls = site_profile.sbatch_calls(calls_log)
    figures = bench_slurm.submission_figures(calls, bench_slurm.cpu_seconds(controller) - cpu_before, wall)
    (tmp_path / "controller.json").write_text(json.dumps({"cpu_s": figures["controller_cpu_s"], "wall_s": wall}))
    print(f"\n[grid] {CELLS} cells: {json.dumps(figures)} (figures in {tmp_path})")

    # both interrupted cells resumed from their state, past its beginning
    for cell in (cancelled["cell"], lost["cell"]):
        log = (results / "logs" / "pretrain" / f"{cell}.log").read_text()
        resumed = RESUMED.search(log)
        assert resumed, f"{cell} did not resume:\n{log[-3000:]}"
        assert (int(resumed[2]), int(resumed[3])) != (1, 0), resumed[0]  # not a restart from epoch 1, step 0
        assert resumed[1].endswith(f"state/{cell}/last.pt"), resumed[0]
        print(f"[grid] {cell}: {resumed[0]}")

    # one submission per job, but the cancelled pretraining's retry (attempt 2); the lost one was requeued
    submitted: dict[tuple[str, str], list[str]] = {}
    for call in calls:
        wrap = next(a for a in call["argv"] if a.startswith("--wrap="))
        target = re.search(r"--target-jobs '([^']*)'", wrap)[1].replace('"', "")  # cell="K=128,seed=1"
        submitted.setdefault(tuple(target.split(":", 1)), []).append(re.search(r"--attempt (\d+)", wrap)[1])
    again = {key: attempts for key, attempts in submitted.items() if len(attempts) > 1}
    assert again == {("pretrain", f"cell={cancelled['cell']}"): ["1", "2"]}, again
    assert sum(1 for rule, _ in submitted if rule == "pretrain") == CELLS
    assert sum(1 for rule, _ in submitted if rule == "probe") == CELLS

    # nothing finished before a fault was written again
    for path, mtime in {**before_cancel, **before_down}.items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was rewritten"

    # the tables hold every cell, each with its probe's accuracy
    with (results / "tables" / "cells.csv").open() as f:
        rows = list(csv.DictReader(f))
    # (a tiny cell may collapse, status "fail": a result of training, not of the run)
    assert len(rows) == CELLS and all(r["top1"] for r in rows), [(r["cell"], r["status"], r["top1"]) for r in rows]
    assert {r["epochs_run"] for r in rows} == {str(GRID["pretrain"]["epochs"])}
    assert {(int(r["K"]), float(r["m"]), int(r["seed"])) for r in rows} == {
        (k, m, s) for k in K for m in M for s in range(SEEDS)
    }
