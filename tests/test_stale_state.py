"""A run resumes only from its own state, and what cannot change a result reruns nothing.

- pretraining: a state written under another config is set aside (never resumed, never
  deleted) and the run starts fresh, ending bit-identical to a fresh run of the new config;
  a finished run leaves no state a later run resumes;
- the rules: Snakemake compares only the keys that determine a job's result (threads, workers
  and monitor frequency rerun nothing), and a dataset folder whose content changed under the
  same path is converted again.
"""

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import REPO, run, snakemake_cli
from test_rerun import TINY, cell_jobs, planned_jobs, snakemake
from test_resume import CFG, assert_same_run

from pipeline.base.layout import folder_state
from pipeline.dag.config import result_config
from pipeline.data.loaders import data_identity
from pipeline.pretrain import run_fingerprint

NEW_LR = 0.07  # CFG's lr is 0.05
NEW = copy.deepcopy(CFG)
NEW["pretrain"]["lr"] = NEW_LR


def command(cfg, data, out, state):
    return [sys.executable, "-m", "pipeline.pretrain", "--config", json.dumps(cfg), "--data", str(data)] + [
        "--out",
        str(out),
        "--state",
        str(state),
        "--no-progress",
    ]


def pretrain(cfg, data, out, state) -> str:
    proc = subprocess.run(command(cfg, data, out, state), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def load(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)


@pytest.fixture(scope="module")
def fresh_new(ffcv_small, tmp_path_factory):
    """A fresh run of the changed config: what any rerun after the change must end with."""
    out = tmp_path_factory.mktemp("fresh_new")
    pretrain(NEW, ffcv_small, out / "run", out / "state")
    return load(out / "run")


# --- the fingerprint ----------------------------------------------------------------------------
def test_fingerprint_holds_the_result_keys_and_the_data_not_threads_paths_or_times(ffcv_small, tmp_path):
    fp = run_fingerprint(CFG, ffcv_small, 1)
    assert fp["pretrain"]["lr"] == 0.05 and fp["pretrain"]["seed"] == 3 and fp["data"]["crop"] == "loader"
    assert not {"threads", "knn_every", "checkpoint_every"} & set(fp["pretrain"]) and "workers" not in fp["data"]
    assert fp["data files"]["train.beton bytes"] == (ffcv_small / "train.beton").stat().st_size
    # a requeue: other thread, worker and monitor settings, the data seen under another path
    moved = tmp_path / "elsewhere"
    shutil.copytree(ffcv_small, moved)
    runtime = copy.deepcopy(CFG)
    runtime["pretrain"].update(threads=2, knn_every=1, checkpoint_every=0)
    runtime["data"]["workers"] = 1
    assert run_fingerprint(runtime, moved, 1) == fp
    assert run_fingerprint(NEW, ffcv_small, 1) != fp
    assert run_fingerprint(CFG, ffcv_small, 2) != fp  # the world size sets per-rank batches and BN groups


def test_data_identity_is_the_content_not_the_conversion_run(ffcv_small, tmp_path):
    """Re-converting the same images (another path, more workers, other times) keeps the data's
    identity, and so every run's state; other data changes it."""
    moved = tmp_path / "elsewhere"
    shutil.copytree(ffcv_small, moved)
    report = json.loads((moved / "train.json").read_text())
    rerun = copy.deepcopy(report)
    rerun["beton"], rerun["source"]["root"] = "/elsewhere/train.beton", "/elsewhere/images"
    rerun["options"].update(workers=8, writers=8)
    rerun["seconds"] = {"check": 9.9, "write": 99.0}
    (moved / "train.json").write_text(json.dumps(rerun))
    assert data_identity(moved) == data_identity(ffcv_small)
    other = copy.deepcopy(report)
    other["sample_keys_sha1"] = "0" * 40  # other images
    (moved / "train.json").write_text(json.dumps(other))
    assert data_identity(moved) != data_identity(ffcv_small)


def test_random_init_depends_only_on_its_network_and_seed():
    random_init = {**CFG["pretrain"], "method": "random"}
    key = result_config({"data": CFG["data"], "pretrain": random_init})
    # pipeline.methods.build.arch_of (backbone, width, cifar_stem; norm, patch_size, depth unset here),
    # the seed, the method; the image size (a ViT's)
    assert key == {
        "data": {"crop_size": 32},
        "pretrain": {"method": "random", "backbone": "resnet18", "width": 8, "cifar_stem": True, "seed": 3},
    }


def test_loader_workers_never_change_a_result():
    """Both loaders draw each sample's crops from (seed, epoch, index): data.workers is no result key."""
    for loader in ("ffcv", "torchvision"):
        for crop in ("loader", "device"):
            assert "workers" not in result_config({"data": {**CFG["data"], "loader": loader, "crop": crop}})["data"]


# --- pretraining reruns -------------------------------------------------------------------------
@pytest.mark.integration
def test_a_changed_key_after_a_finished_run_trains_afresh(ffcv_small, fresh_new, tmp_path):
    first = pretrain(CFG, ffcv_small, tmp_path / "run", tmp_path / "state")
    assert "finished: state kept as" in first
    assert sorted(os.listdir(tmp_path / "state")) == ["finished.pt"]  # nothing a later run resumes
    rerun = pretrain(NEW, ffcv_small, tmp_path / "run", tmp_path / "state")
    assert "resumed from" not in rerun and "another run's state" not in rerun
    assert_same_run(fresh_new, load(tmp_path / "run"))
    assert len(list((tmp_path / "tensorboard" / "pretrain").glob("events.*"))) == 1  # no earlier curve


@pytest.mark.integration
def test_a_run_killed_mid_epoch_then_changed_starts_fresh_and_says_why(ffcv_small, fresh_new, tmp_path):
    out, state = tmp_path / "run", tmp_path / "state"
    proc = subprocess.Popen(command(CFG, ffcv_small, out, state), cwd=REPO, stdout=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (state / "last.pt").exists():  # the first resume state (checkpoint_every: 1 step)
        assert proc.poll() is None and time.time() < deadline, "the run ended before it saved a state"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = torch.load(state / "last.pt", weights_only=True)
    assert not (out / "checkpoint.pt").exists() and saved["epoch"] < CFG["pretrain"]["epochs"]
    rerun = pretrain(NEW, ffcv_small, out, state)
    lines = [line for line in rerun.splitlines() if "another run's state" in line]
    assert len(lines) == 1 and "(pretrain.lr 0.05 -> 0.07)" in lines[0] and "starting fresh" in lines[0], rerun
    assert "resumed from" not in rerun
    stale = [p.name for p in state.glob("last.stale-*.pt")]
    assert len(stale) == 1 and stale[0] in lines[0]  # kept, and named in the line
    assert_same_run(fresh_new, load(out))


@pytest.mark.integration
def test_a_state_without_fingerprint_is_set_aside(ffcv_small, tmp_path):
    """States written before runs were fingerprinted are another run's, whatever their config."""
    from pipeline.runtime import checkpoint

    state = tmp_path / "state"
    checkpoint.save(state / "last.pt", epoch=1, step_in_epoch=0)
    rerun = pretrain(CFG, ffcv_small, tmp_path / "run", state)
    assert "has no fingerprint" in rerun and "resumed from" not in rerun, rerun
    assert len(list(state.glob("last.stale-*.pt"))) == 1


# --- the rules' keys: dry runs on finished results ---------------------------------------------
ONLY = ["grid={only: [base, method=random]}", "detect={cells: [base]}"]


def run_two_cells(results) -> None:
    """The tiny workflow with two cells: MoCo's base cell (pretraining, probe, a Mask R-CNN trial)
    and random init; every stage of the workflow, the tables included."""
    run([*snakemake_cli(), "--cores", "2", "--configfile", TINY, "--config", f"results={results}", *ONLY], timeout=900)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real tiny run of two cells (base with detection, random-init): Snakemake records
    every job's params, which the dry runs below compare."""
    results = tmp_path_factory.mktemp("keys") / "results"
    run_two_cells(results)
    return results


@pytest.mark.slow
def test_same_config_gives_the_same_checkpoints_and_tables(finished, tmp_path):
    """The finished run's config again from an empty results folder: every checkpoint
    bit-identical (weights, BN statistics, queue, pretraining log but its timings) and every table
    the same (the probe's accuracy, the detection trial's box and mask AP). (Until issue 50 this ran the tiny
    preset's five cells; three of them are the base cell's code at other values of K, m and
    shuffle_bn, and cost another whole workflow.)"""
    again = tmp_path / "results"
    run_two_cells(again)
    cells = sorted(p.name for p in (finished / "cells").iterdir())
    assert cells == ["base", "method=random"]
    for cell in cells:
        a, b = (load(r / "cells" / cell / "pretrain") for r in (finished, again))
        for part in ("backbone", "model"):
            assert a[part].keys() == b[part].keys()
            for key in a[part]:
                assert torch.equal(a[part][key], b[part][key]), f"{cell}: {part}.{key} differs between runs"
        untimed = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
        assert untimed(a["log"]) == untimed(b["log"]), cell
    tables = sorted(p.name for p in (finished / "tables").glob("*.csv"))
    assert {"cells.csv", "methods.csv", "segmentation.csv"} <= set(tables), tables  # probe, AP, mask AP
    for name in tables:
        assert (finished / "tables" / name).read_text() == (again / "tables" / name).read_text(), name


def planned(results, *config):
    """Jobs a dry run plans with ``config`` on top (later values of a section win key by key)."""
    return planned_jobs(snakemake(results, "-n", config=[*ONLY, *config]).stdout)


@pytest.mark.slow
def test_threads_workers_and_monitor_frequency_rerun_nothing(finished):
    assert planned(finished) == set()
    runtime = [
        "pretrain={threads: 2, knn_every: 1, checkpoint_every: 5}",
        "data={workers: 2}",
        "probe={threads: 2}",
        "detect={cells: [base], threads: 2}",
        "convert={workers: 1}",
        "grid={only: [base, method=random], resources: {minutes_per_epoch: 3}}",
    ]
    assert planned(finished, *runtime) == set()


def test_a_world_size_change_reruns_the_trained_cell_a_launcher_change_does_not(finished):
    """The finished run had one rank per cell. Two ranks per node under srun (a SLURM profile's
    geometry, here from the command line) change the base cell's per-rank batch: it reruns, with
    what reads it; the random-init baseline trains nothing and stays. submitit on one node x one
    task is again one rank: nothing reruns."""
    srun = ["--set-resources", "pretrain:mpi=srun", "pretrain:tasks_per_node=2"]
    base = cell_jobs("base", "pretrain", "probe", "detect", "detect_trials") | {("tables", None), ("all", None)}
    assert planned_jobs(snakemake(finished, "-n", *srun, config=ONLY).stdout) == base
    one_rank = "launch={launcher: submitit, slurm: {nodes: 1, tasks_per_node: 1}}"
    assert planned(finished, one_rank) == set()


@pytest.mark.slow
def test_a_result_key_reruns_exactly_its_cells_and_what_reads_them(finished):
    tables = {("tables", None), ("all", None)}
    base = cell_jobs("base", "pretrain", "probe", "detect", "detect_trials")
    # lr: the trained cell, not the random-init one (it trains nothing)
    assert planned(finished, "pretrain={lr: 0.05}") == base | tables
    # the network's width: both cells
    random_init = {("pretrain_random_init", "method=random"), ("probe", "method=random")}
    assert planned(finished, "pretrain={width: 16}") == base | random_init | tables
    assert planned(finished, "probe={epochs: 3}") == cell_jobs("base", "probe") | {("probe", "method=random")} | tables
    detect = cell_jobs("base", "detect", "detect_trials")
    assert planned(finished, "detect={cells: [base], lr: 0.01}") == detect | tables
    # the scenes' categories: the scenes and the transfer, no pretraining or probe
    assert (
        planned(finished, "dataset={synthetic: {det_shapes: pretraining}}") == {("synthetic", None)} | detect | tables
    )
    # a key set to its default is the key left out: nothing reruns
    assert planned(finished, "dataset={synthetic: {seed: 0, det_shapes: novel}}") == set()


# --- conversion: the dataset folder's content ---------------------------------------------------
def test_folder_state_sees_added_and_replaced_files_not_the_path(tmp_path):
    root = tmp_path / "data"
    (root / "train" / "a").mkdir(parents=True)
    (root / "train" / "a" / "0.png").write_bytes(b"0")
    before = folder_state(root)
    copied = tmp_path / "copy"
    shutil.copytree(root, copied)  # file and folder times kept: the same content elsewhere
    assert folder_state(copied) == before
    (root / "train" / "a" / "1.png").write_bytes(b"1")
    added = folder_state(root)
    assert added != before
    (root / "train" / "a" / "new.tmp").write_bytes(b"2")
    os.replace(root / "train" / "a" / "new.tmp", root / "train" / "a" / "0.png")  # as rsync replaces a file
    assert folder_state(root) != added
    assert folder_state(tmp_path / "missing") is None


@pytest.mark.integration
def test_a_changed_dataset_folder_is_converted_again(synthetic_small, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(synthetic_small / "cls", root)
    results = tmp_path / "results"
    dataset = [f"dataset={{source: imagefolder, root: {root}}}", "detect={enabled: false}"]
    report = f"{results}/data/ffcv/train.json"
    snakemake(results, report, config=dataset)
    assert planned_jobs(snakemake(results, report, "-n", config=dataset).stdout) == set()
    cls = next(p for p in sorted((root / "train").iterdir()) if p.is_dir())
    shutil.copy(next(cls.iterdir()), cls / "added.png")
    assert planned_jobs(snakemake(results, report, "-n", config=dataset).stdout) == {("convert", None)}
