"""The workflow on a real SLURM cluster: two slurmd "nodes" (n1, n2) on this machine
(tests/slurm_cluster.py), started once for these tests and stopped afterwards.

- the tiny preset end to end through the site profile (profiles/slurm, with only what this
  cluster cannot match changed: tests/site_profile.py), pretraining on 2 nodes x 2 gloo ranks;
  in the same run a probe and a detection trial are signalled mid-run and resume exactly;
  every real sbatch line is recorded (a wrapper first on PATH) and checked against what the
  profile's text promises;
- the submitit launcher: a 2-node pretraining submitted, interrupted, requeued and finished;
- Snakemake + srun (site profile): a 2-rank pretraining interrupted (SIGUSR1), requeued by
  itself, resumed, and bit-identical to an uninterrupted run on 2 nodes;
- a failing job fails its Snakemake job, with the error in its log, and nothing hangs.

Every call has a hard timeout: on a cluster the failure mode is a hang. Runs as root only
(daemons, /etc/slurm/slurm.conf); skipped elsewhere, but fails in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import site_profile
import torch
import yaml
from conftest import REPO, hard_run, snakemake_cli

from pipeline.dag.config import merge

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
        "--wait=60",  # as the pretrain rule's srun: a rank that dies ends the others (no hang)
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


def snakemake_cmd(profile: Path, results: Path, *targets, configfiles=()) -> list[str]:
    return [
        *site_profile.snakemake_command(),
        "--profile",
        str(profile),
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


def assert_ranks(log: str, world: int, nodes: int) -> None:
    """Ranks 0..world-1 on `nodes` different nodes, identical queues at the end (a log may hold
    several starts of a rank: the runs before a requeue)."""
    starts, ends = ranks(log)
    assert starts and {w for _, w, _ in starts} == {str(world)}, log[-3000:]
    hosts = {r: h for r, _, h in starts}
    assert sorted(hosts, key=int) == [str(r) for r in range(world)], starts
    assert len(set(hosts.values())) == nodes and set(hosts.values()) <= {"n1", "n2"}, starts
    assert sorted((int(r), w) for r, w, _, _ in ends) == [(r, str(world)) for r in range(world)], log[-3000:]
    assert {host for _, _, host, _ in ends} == set(hosts.values())
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
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True, timeout=30)
    jobs = out.stdout.split()
    assert len(jobs) == 1, f"expected one running job (the pretraining): {out.stdout}"
    return jobs[0]


def restarts(job: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"Restarts=(\d+)", out)
    return int(found.group(1)) if found else -1


def run_interrupted(
    profile: Path, results: Path, signal_name: str, configfiles, timeout: float
) -> tuple[str, str, str]:
    """Snakemake (the site profile) makes results/cells/base/pretrain; the job is signalled
    once it trains. Returns (snakemake output, the rule's log, the SLURM job id)."""
    target = results / "cells" / "base" / "pretrain" / "checkpoint.pt"
    output = results.parent / "snakemake.out"
    cmd = [
        "timeout",
        "-s",
        "KILL",
        str(int(timeout)),
        *snakemake_cmd(profile, results, target, configfiles=configfiles),
    ]
    with output.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            job = interrupt_when_training(results, proc, output, signal_name)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:  # timeout and snakemake under it (killing timeout alone leaves snakemake)
                os.killpg(proc.pid, signal.SIGKILL)
    text = output.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text, (results / "logs" / "pretrain" / "base.log").read_text(), job


# --- tests ------------------------------------------------------------------------------------
def test_profiles_parse(site_profile_dir):
    """profiles/slurm (the site template) and the test cluster's version of it build the DAG
    (no cluster needed)."""
    for profile in ("profiles/slurm", site_profile_dir):
        proc = hard_run(
            [
                *snakemake_cli(),
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


# --- the site profile, submitted for real ----------------------------------------------------------
SITE_NODES = 2  # grid.resources.nodes of the site run: every pretraining on both nodes


def sbatch_options(argv: list[str]) -> dict:
    """sbatch's argv as {option: value} (True for a flag): "-t 30" and "--nodes=2" alike."""
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, _, val = arg.partition("=")
            out[key] = val
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out[arg] = argv[i + 1]
            i += 1
        else:
            out[arg] = True
        i += 1
    return out


def rule_resources(profile: dict, rule: str) -> dict:
    """A rule's resources as a profile states them: default-resources < set-resources.<rule>."""
    return {**profile["default-resources"], **profile["set-resources"].get(rule, {})}


# The site run's probe (augmented: 5 steps an epoch through the backbone) and detection
# (3 iterations an epoch) last long enough to be signalled mid-run; the state after every step.
STAGES = {
    "probe": {"mode": "augmented", "epochs": 12, "batch_size": 32, "checkpoint_every": 1},
    "detect": {"epochs": 4, "checkpoint_every": 1},
}
# the jobs signalled mid-run (squeue's comment names the rule and the wildcards' values)
INTERRUPTED = {"probe": ("base", "state/base/probe/last.pt"), "detect": ("base_0", "state/base/detect/trial0/last.pt")}


def interrupt_stages(results: Path, proc: subprocess.Popen) -> dict:
    """Send SIGUSR1 (as SLURM before a time limit) to base's probe job and its detection trial
    once each has written its first resume state; returns {rule: SLURM job id}."""
    from test_slurm_grid import running_jobs

    sent: dict[str, str] = {}
    while len(sent) < len(INTERRUPTED) and proc.poll() is None:
        for rule, (cell, state) in INTERRUPTED.items():
            if rule in sent or not (results / state).exists():
                continue
            job = next((j["job"] for j in running_jobs() if (j["rule"], j["cell"]) == (rule, cell)), None)
            if job is not None:
                subprocess.run(["scancel", "--signal=USR1", job], check=True, timeout=30)
                sent[rule] = job
        time.sleep(0.2)
    return sent


@pytest.fixture(scope="module")
def site_run(cluster, site_profile_dir, tmp_path_factory):
    """The tiny preset (cells base and method=random) through the site profile, every
    pretraining on 2 nodes; every sbatch call recorded by a wrapper first on PATH. Base's probe
    and detection trial are signalled mid-run (interrupt_stages)."""
    tmp = tmp_path_factory.mktemp("site-run")
    bin_dir, calls_log = site_profile.sbatch_wrapper(tmp, sys.executable)
    nodes = tmp / "nodes.yaml"
    nodes.write_text(json.dumps({"grid": {"resources": {"nodes": SITE_NODES}}, **STAGES}))
    results = tmp / "results"
    cmd = snakemake_cmd(site_profile_dir, results, configfiles=[base_cells_only(tmp, {}), nodes])
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    output = tmp / "snakemake.out"
    with output.open("w") as sink:
        proc = subprocess.Popen(
            ["timeout", "-s", "KILL", "560", *cmd], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            interrupted = interrupt_stages(results, proc)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    out = output.read_text()
    assert proc.returncode == 0, out[-5000:] + cluster.logs()
    calls = [sbatch_options(call["argv"]) for call in site_profile.sbatch_calls(calls_log)]
    by_rule = {}
    for call in calls:
        by_rule.setdefault(re.search(r"--allowed-rules (\w+)", call["--wrap"])[1], []).append(call)
    return {
        "results": results,
        "out": out,
        "calls": by_rule,
        "logdir": results.parent / "slurm_logs",
        "interrupted": interrupted,
    }


@pytest.mark.timeout(600)
def test_site_profile_runs_the_tiny_workflow_with_two_node_pretraining(site_run):
    """Every rule a SLURM job; each pretraining one job on n1 and n2 with 2 gloo ranks on each
    (srun inside the job); identical queues at the end."""
    results = site_run["results"]
    assert {"synthetic", "convert", "pretrain", "pretrain_random_init", "probe", "detect", "tables"} <= set(
        site_run["calls"]
    ), sorted(site_run["calls"])
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
            assert_ranks(log, world=SITE_NODES * site_profile.SITE_OVERRIDES["gpus_per_node"], nodes=SITE_NODES)


@pytest.mark.timeout(600)
def test_every_sbatch_line_is_what_the_site_profile_states(site_run, site_profile_dir):
    """Partition, time limit, memory and cores of every real submission are the profile's for its
    rule (default-resources < set-resources), at the first attempt; every job is requeueable;
    no account is sent (the test cluster's override), no GPU geometry without gres."""
    site = site_profile.site()
    assert site["slurm-requeue"] is True
    tested = yaml.safe_load((site_profile_dir / "config.yaml").read_text())  # sizes: with the overrides
    for rule, calls in site_run["calls"].items():
        wanted, sized = rule_resources(site, rule), rule_resources(tested, rule)
        for call in calls:
            assert call["-p"] == wanted["slurm_partition"], (rule, call)
            assert call["--requeue"] is True and "--no-requeue" not in call, (rule, call)
            assert call["--mem"] == str(sized["mem_mb"]), (rule, call)
            assert call["--cpus-per-task"] == str(sized["cpus_per_task"]), (rule, call)
            assert "-A" not in call and "--account" not in call, (rule, call)
            assert "--gres" not in call and "--ntasks-per-gpu" not in call, (rule, call)
            if rule != "pretrain":  # its limit comes from the workflow config (grid.resources)
                limits = {str(eval(str(wanted["runtime"]), {"attempt": a})) for a in (1, 2, 3)}
                assert call["-t"] in limits, (rule, call)
    # runtimes the profile states by hand: probe "240 * attempt", detect "480 * attempt", tables 15;
    # the interrupted probe and detection trial may come back as their second attempt
    assert sorted(c["-t"] for c in site_run["calls"]["probe"])[:2] == ["240", "240"]
    assert "480" in {c["-t"] for c in site_run["calls"]["detect"]}
    assert [c["-t"] for c in site_run["calls"]["tables"]] == ["15"]
    for rule in ("probe", "detect"):  # the warning signal before the limit: save and requeue
        assert {c["--signal"] for c in site_run["calls"][rule]} == {"USR1@180"}


@pytest.mark.timeout(600)
def test_pretraining_line_asks_for_nodes_ranks_and_the_warning_signal(site_run):
    """The site profile's pretraining: srun geometry (nodes from grid.resources, one rank per
    'GPU' per node), SIGUSR1 3 minutes before the limit, a limit from grid.resources."""
    pretrain = rule_resources(site_profile.site(), "pretrain")
    (call,) = site_run["calls"]["pretrain"]
    assert pretrain["mpi"] == "srun" and pretrain["slurm_extra"] == "--signal=USR1@180"
    assert call["--signal"] == "USR1@180"
    assert call["--nodes"] == str(SITE_NODES)
    assert call["--ntasks-per-node"] == str(site_profile.SITE_OVERRIDES["gpus_per_node"])
    assert "--ntasks" not in call  # the ranks are srun's, inside the allocation
    # grid.resources of config.yaml: overhead 10 min + 1 min/epoch x 2 epochs (tiny) x 1 (resnet18) / 2 nodes
    assert call["-t"] == "11"
    (baseline,) = site_run["calls"]["pretrain_random_init"]  # trains nothing: the profile's small CPU job
    assert (baseline["-p"], baseline["--nodes"], baseline["--cpus-per-task"]) == ("cpu", "1", "2")
    assert (baseline["--mem"], baseline["-t"]) == ("8000", "15")


@pytest.mark.timeout(600)
def test_slurm_logs_of_successful_jobs_are_kept(site_run):
    """slurm-keep-successful-logs: every submitted job's SLURM log is still there after success,
    at <slurm-logdir>/rule_<rule>/<wildcards>/<jobid>.log."""
    assert site_profile.site()["slurm-keep-successful-logs"] is True
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", site_run["out"])
    assert len(submitted) == sum(len(c) for c in site_run["calls"].values())
    for job, log in submitted:
        path = Path(log)
        assert path.name == f"{job}.log" and path.is_file(), (job, log)
        assert path.is_relative_to(site_run["logdir"]) and path.relative_to(site_run["logdir"]).parts[0].startswith(
            "rule_"
        )


@pytest.mark.timeout(600)
def test_probe_and_detection_signalled_mid_run_resume_exactly(site_run, tmp_path):
    """Base's probe and detection trial, signalled (USR1) mid-run on the cluster, resumed from
    their states and ended equal to the same runs uninterrupted here."""
    from test_stage_resume import RUN_ONLY

    results = site_run["results"]
    assert set(site_run["interrupted"]) == set(INTERRUPTED), "a stage ended before it could be signalled"
    for rule, log, metrics, data in [
        ("probe", "probe/base.log", "base/probe.json", results / "data" / "ffcv"),
        ("detect", "detect/base/trial0.log", "base/detect/trial0.json", results / "data" / "synthetic" / "det"),
    ]:
        text = (results / "logs" / log).read_text()
        assert f"[{rule}] resumed from" in text, text[-3000:]
        got = json.loads((results / "cells" / metrics).read_text())
        ref = tmp_path / f"{rule}.json"
        seed = ["--seed", str(got["seed"])] if rule == "detect" else []
        cmd = [sys.executable, "-m", f"pipeline.{rule}", "--config", json.dumps(got["config"]), *seed]
        proc = hard_run([*cmd, "--checkpoint", got["checkpoint"], "--data", data, "--out", ref], timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        want = json.loads(ref.read_text())
        assert {k: v for k, v in got.items() if k not in RUN_ONLY} == {
            k: v for k, v in want.items() if k not in RUN_ONLY
        }, rule


@pytest.mark.timeout(480)
def test_submitit_launcher_requeues_and_resumes(cluster, site_profile_dir, exact_results, reference, tmp_path):
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
    out, log, job = run_interrupted(
        site_profile_dir, results, "USR2", [exact_results / "overlay.yaml", launch], timeout=420
    )
    assert "submitted slurm job" in log and "checkpoint: resubmitting" in log, log[-4000:]
    assert "Requeued job" in log, log[-4000:]
    assert "resumed from" in log, log[-4000:]
    assert restarts(job) >= 1
    assert_ranks(log, world=2, nodes=2)  # launch.slurm: 2 nodes x 1 task
    assert_same_weights(torch.load(results / "cells/base/pretrain/checkpoint.pt", weights_only=True), reference)


@pytest.mark.timeout(480)
def test_interrupted_pretraining_requeues_and_resumes_exactly(
    cluster, site_profile_dir, exact_results, reference, tmp_path
):
    """launcher direct: SIGUSR1 to the job's ranks -> state saved, `scontrol requeue` -> the
    same SLURM job reruns the rule, which resumes; the result equals the uninterrupted run."""
    results = results_with_data(exact_results, tmp_path / "results")
    out, log, job = run_interrupted(site_profile_dir, results, "USR1", [exact_results / "overlay.yaml"], timeout=420)
    assert re.search(r"resumed from \S+ at epoch \d+, step \d+", log), log[-4000:]
    assert restarts(job) >= 1, "the job was not requeued"
    assert out.count("has been submitted with SLURM jobid") == 1  # one job: requeued, not resubmitted
    # the site profile's geometry: 1 node (grid.resources) x 2 ranks; the reference ran on 2 nodes
    assert_ranks(log, world=2, nodes=1)
    assert_same_weights(torch.load(results / "cells/base/pretrain/checkpoint.pt", weights_only=True), reference)


@pytest.mark.timeout(300)
def test_failing_job_fails_the_workflow(cluster, site_profile_dir, exact_results, tmp_path):
    """A config error that only shows with 2 ranks: the job fails, Snakemake reports it with
    the job's log, and returns."""
    results = results_with_data(exact_results, tmp_path / "results")
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(BAD))
    target = results / "cells" / "base" / "pretrain" / "checkpoint.pt"
    only_base = base_cells_only(tmp_path, merge(EXACT, BAD))  # the tiny grid's K=128 needs an even batch
    proc = hard_run(
        # no retries: the profile's restart-times would run the failing job 3 times
        [
            *snakemake_cmd(
                site_profile_dir, results, target, configfiles=[exact_results / "overlay.yaml", bad, only_base]
            ),
            *("--restart-times", "0"),
        ],
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, -9, 137), out[-4000:]  # failed, not killed by the timeout
    assert "Error in rule pretrain" in out, out[-4000:]
    why = "pretrain.batch_size=9 is not divisible by the world size 2"
    assert why in (results / "logs" / "pretrain" / "base.log").read_text()
    assert why in out  # show-failed-logs: the log is in Snakemake's output
    assert not target.exists()
