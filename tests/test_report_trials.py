"""python -m pipeline.report.trials: every detection trial of a results folder, finished,
collapsed, diverged or unfinished, read from what the detection stage writes (its metrics, its
log), never dropped."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_detect import TINY, ckpt_path, det_dir  # noqa: F401 (fixtures)
from test_tables import fake_cell

from pipeline.report import trials
from pipeline.report.trials import MAIN


def trial_files(results, cell, protocol):
    metrics, log = trials.where(results, cell, protocol)
    return Path(str(metrics).format(trial=0)), Path(str(log).format(trial=0))


@pytest.fixture(scope="module")
def results(det_dir, ckpt_path, tmp_path_factory):  # noqa: F811 (fixtures)
    """Seeds 0 and 1 of the base cell; each fine-tuned by the detection stage as the workflow runs
    it (its output to the trial's log): seed 0 trains, seed 1 at lr 1e6 diverges. Under a second
    protocol, seed 1 has metrics and seed 0 a log that has not ended."""
    r = tmp_path_factory.mktemp("results")
    fake_cell(r, "base", 60.0)
    fake_cell(r, "seed=1", 61.0)

    def fine_tune(cell, lr):
        out, log = trial_files(r, cell, MAIN)
        log.parent.mkdir(parents=True)
        cfg = json.dumps({"detect": {**TINY, "lr": lr}})
        cmd = [sys.executable, "-m", "pipeline.detect", "--config", cfg, "--checkpoint", str(ckpt_path)]
        with log.open("w") as f:
            cmd += ["--data", str(det_dir), "--out", str(out)]
            return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=600).returncode

    assert fine_tune("base", TINY["lr"]) == 0
    assert fine_tune("seed=1", 1e6) != 0
    out, _ = trial_files(r, "seed=1", "bf16")
    out.parent.mkdir(parents=True)
    shutil.copy(trial_files(r, "base", MAIN)[0], out)
    _, log = trial_files(r, "base", "bf16")
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1/12: 40%\n")
    return r


def test_each_trial_shows_its_ap_or_why_it_has_none(results):
    box = json.loads(trial_files(results, "base", MAIN)[0].read_text())["AP50"]
    lines = trials.table(results, [MAIN, "bf16"], failed_below=box).splitlines()
    assert lines[0] == "| group | seed | trial | main: box / mask AP50 | bf16: box / mask AP50 |"
    assert lines[2] == f"| base | 0 | 0 | {box:.1f} / — | unfinished |"
    assert lines[3] == f"| base | 1 | 0 | **diverged** (loss not finite, epoch 1) | {box:.1f} / — |"
    # failed: diverged or collapsed; the unfinished trial is counted as a trial, not as failed
    assert "| base | main | 2 | 1 | 1 | 1 | 0 |" in lines
    assert "| base | bf16 | 2 | 1 | 0 | 0 | 0 |" in lines


def test_a_trial_that_ends_below_the_line_has_collapsed(results):
    box = json.loads(trial_files(results, "base", MAIN)[0].read_text())["AP50"]
    out = trials.main([str(results), "--failed-below", str(box + 0.1)])
    assert f"| base | 0 | 0 | **collapsed** {box:.1f} / — |" in out
    assert "| base | main | 2 | 1 | 2 | 1 | 1 |" in out
    assert f"box AP50 below {box + 0.1:g} at the end" in out


def test_a_trial_stopped_by_another_error_shows_it(tmp_path):
    fake_cell(tmp_path, "base", 60.0)
    _, log = trial_files(tmp_path, "base", MAIN)
    log.parent.mkdir(parents=True)
    log.write_text("[detect] error: checkpoint not found: x.pt\n")
    assert "| base | 0 | 0 | error: checkpoint not found: x.pt |" in trials.table(tmp_path, [MAIN])
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.report.trials", str(tmp_path), "--protocol"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| base | 0 | 0 | error: checkpoint not found: x.pt |" in out
    assert trials.table(tmp_path, ["bf16"]) == f"No detection trial under {tmp_path}/cells."
