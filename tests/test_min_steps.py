"""pretrain.min_steps: the base cell trains at least the study's 520 steps on any training set.

The recipe study chose 520 steps of 64 images, written as 13 epochs of the embedded 2,600
images; on a folder of 1,438 images 13 epochs are 286 steps, too few
(docs/studies/2026-12-02-digits.md). Expected epochs below are computed by hand from that definition.
"""

import copy
import json
import subprocess

import pytest

from pipeline.dag.config import DEFAULT_CONFIG, load_config, load_yaml, result_part
from pipeline.dag.grid import claims_cells, grid_cells
from tests.conftest import snakemake_cli


def folder(root, images: int, classes: int = 10):
    """An imagefolder with ``images`` image files under train/ (only their names are counted
    before conversion), a hidden file and a text file that are not images."""
    train = root / "train"
    for i in range(images):
        cls = train / f"c{i % classes}"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"{i}.png").touch()
    (train / "c0" / ".hidden.png").touch()
    (train / "c0" / "notes.txt").touch()
    (train / "c1" / "loop").symlink_to(train, target_is_directory=True)  # counted once, as conversion reads it
    (root / "val" / "c0").mkdir(parents=True)
    return root


def config(root=None, **pretrain):
    cfg = copy.deepcopy(load_yaml(DEFAULT_CONFIG))
    cfg["pretrain"].update(pretrain)
    if root is not None:
        cfg["dataset"] = {"source": "imagefolder", "root": str(root)}
        cfg["detect"]["enabled"] = False
    return cfg


def test_the_embedded_data_keeps_13_epochs():
    cfg = config()
    assert load_config(cfg).pretrain.epochs == 13  # 2,600 // 64 = 40 steps an epoch: 13 x 40 = 520
    assert cfg["pretrain"]["epochs"] == 13


def test_a_small_folder_trains_24_epochs_and_the_jobs_are_told(tmp_path):
    cfg = config(folder(tmp_path / "digits", 1438))
    typed = load_config(cfg)
    # 1,438 // 64 = 22 steps an epoch; 520 / 22 = 23.6 -> 24 epochs (528 steps)
    assert typed.pretrain.epochs == 24
    assert cfg["pretrain"]["epochs"] == 24  # what the jobs' JSON states
    cells = grid_cells(typed)
    assert cells["base"].pretrain.epochs == 24
    assert cells["method=supervised"].pretrain.epochs == 24  # the baseline follows the base


def test_cells_with_their_own_epochs_keep_them(tmp_path):
    cfg = config(folder(tmp_path / "digits", 1438))
    cfg["grid"].update({"only": None, "one_at_a_time": {"epochs": [6]}})
    cfg["dataset"]["train_images"] = 1438
    typed = load_config(cfg)
    assert grid_cells(typed)["epochs=6"].pretrain.epochs == 6
    claims = claims_cells(typed)
    reference = [c for c in claims.values() if c.override.get("epochs") == typed.claims.epochs]
    assert reference and all(c.pretrain.epochs == 9 for c in reference)


def test_off_large_or_unknown_leaves_epochs_as_set(tmp_path):
    small = folder(tmp_path / "small", 1438)
    assert load_config(config(small, min_steps=0)).pretrain.epochs == 13
    assert load_config(config(small, min_steps=286)).pretrain.epochs == 13  # 13 x 22 = 286: enough
    assert load_config(config(small, min_steps=287)).pretrain.epochs == 14
    big = folder(tmp_path / "big", 2560)  # 40 steps an epoch: 13 x 40 = 520
    assert load_config(config(big)).pretrain.epochs == 13
    assert load_config(config(tmp_path / "not-staged-yet")).pretrain.epochs == 13  # its jobs say so


def test_a_large_folder_is_not_walked_to_the_end(tmp_path, monkeypatch):
    from pipeline.base import folders

    walked = []
    real_walk = folders.os.walk

    def walk(top, **kw):
        for entry in real_walk(top, **kw):
            walked.append(entry[0])
            yield entry

    monkeypatch.setattr(folders.os, "walk", walk)
    root = folder(tmp_path / "many", 6000, classes=60)  # 100 images a class
    assert load_config(config(root)).pretrain.epochs == 13
    # 2,560 images suffice (64 x 40 steps): the walk stops in the 26th of 60 class folders
    assert len(walked) == 26


def test_min_steps_is_not_part_of_a_result():
    """Its effect is the epochs the section states: min_steps alone reruns and resumes nothing."""
    p = load_yaml(DEFAULT_CONFIG)["pretrain"]
    assert "min_steps" not in result_part("pretrain", p)
    assert result_part("pretrain", {**p, "min_steps": 0}) == result_part("pretrain", p)


@pytest.mark.timeout(300)
@pytest.mark.integration
def test_snakemake_gives_the_pretraining_job_the_raised_epochs(tmp_path):
    root = folder(tmp_path / "digits", 1438)
    run = subprocess.run(
        [
            *snakemake_cli(),
            "--config",
            f"results={tmp_path / 'r'}",
            f"dataset={json.dumps({'source': 'imagefolder', 'root': str(root)})}",
            "detect={enabled: false}",
            "grid={only: [base]}",
            "-n",
            "-p",
            "--forceall",
            f"{tmp_path / 'r'}/cells/base/pretrain/summary.json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    shell = next(line for line in run.stdout.splitlines() if "pipeline.pretrain" in line)
    job = json.loads(shell.split("--config '")[1].split("' --data")[0])
    assert (job["pretrain"]["epochs"], job["pretrain"]["min_steps"]) == (24, 520)
    assert "13 epochs of this training set are fewer than pretrain.min_steps=520 steps: the base cell trains 24" in (
        run.stderr
    )
