"""Exact resume after pretraining: a linear probe and a detection trial killed (SIGKILL) or
warned (SIGUSR1, as SLURM before a time limit) mid-run and restarted end bit-identical to an
uninterrupted run: the same metrics, the same final weights and optimizer (finished.pt). The
signal is sent on an event (a log line, the state file), never after a sleep."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from pipeline.nets.models import build_backbone
from pipeline.runtime import checkpoint

pytestmark = pytest.mark.integration  # a stage run as processes: make test-quick leaves it out

ARCH = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
DATA = {"crop_size": 32, "workers": 1}
# cached: 80 images / 16 = 5 steps an epoch, 60 epochs (a signal after epoch 1 lands mid-run);
# augmented: 4 epochs of crops through the frozen backbone
PROBES = {
    "cached": {"mode": "cached", "epochs": 60, "batch_size": 16, "threads": 1, "checkpoint_every": 2},
    "augmented": {"mode": "augmented", "epochs": 4, "batch_size": 16, "threads": 1, "checkpoint_every": 1},
}
# 6 scenes / 2 = 3 iterations an epoch, 3 epochs; the state after every iteration
DETECT = {
    "epochs": 3,
    "batch_size": 2,
    "lr": 0.01,
    "image_size": 64,
    "fpn_channels": 16,
    "norm": "bn",  # BN statistics in the resume state too
    "threads": 1,
    "checkpoint_every": 1,
}
RUN_ONLY = ("timing", "seconds", "checkpoint", "provenance")  # what may differ between two runs


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    checkpoint.save(path, arch=ARCH, method="random", backbone=build_backbone(ARCH).state_dict())
    return path


def probe_cmd(mode: str, ckpt: Path, data: Path, out: Path) -> list[str]:
    cfg = json.dumps({"data": DATA, "probe": PROBES[mode]})
    files = ["--checkpoint", ckpt, "--data", data, "--out", out / "probe.json", "--state", out / "state"]
    return [sys.executable, "-m", "pipeline.probe", "--config", cfg, *map(str, files)]


def detect_cmd(ckpt: Path, data: Path, out: Path) -> list[str]:
    cfg = json.dumps({"detect": DETECT})
    files = ["--checkpoint", ckpt, "--data", data, "--out", out / "detect.json", "--state", out / "state"]
    return [sys.executable, "-m", "pipeline.detect", "--config", cfg, "--seed", "1", *map(str, files)]


def run_through(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def interrupted_then_resumed(cmd: list[str], out: Path, sig: int, event) -> tuple[int, str]:
    """Start ``cmd``, send ``sig`` once ``event(line)`` holds for a line of its output (or, with
    no line event, once its state file exists), let it end, then rerun it to the end. Returns
    the first run's exit status and the resumed run's output."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if event(line):
            break
    else:
        raise AssertionError(f"the run ended before the event:\n{''.join(lines)[-3000:]}")
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    assert not (out / "state" / "finished.pt").exists(), "the run finished before it was interrupted"
    saved = checkpoint.load(out / "state" / "last.pt")
    assert saved["step_in_epoch"] or saved["epoch"], "no progress saved"
    return proc.returncode, run_through(cmd)


def same_run(a: Path, b: Path, metrics: str) -> None:
    """Equal metrics (but for times and paths) and an equal final state (weights, optimizer)."""
    ma, mb = (json.loads((x / metrics).read_text()) for x in (a, b))
    assert {k: v for k, v in ma.items() if k not in RUN_ONLY} == {k: v for k, v in mb.items() if k not in RUN_ONLY}
    sa, sb = (checkpoint.load(x / "state" / "finished.pt") for x in (a, b))
    for state in (sa, sb):  # numpy's and Python's streams: unseeded, and unused by these stages
        for rank in state["ranks"]:
            rank["rng"] = {k: rank["rng"][k] for k in ("torch", "cuda")}
    assert_equal(sa, sb, "state")  # weights, optimizer, schedule, each rank's torch RNG stream


def assert_equal(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), f"{where} differs from the uninterrupted run"
    else:
        assert a == b, f"{where}: {a} != {b}"


# --- the probe --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, sig", [("cached", signal.SIGUSR1), ("augmented", signal.SIGKILL)])
def test_probe_resumes_exactly(ffcv_small, ckpt, tmp_path, mode, sig):
    ref, cut = tmp_path / "uninterrupted", tmp_path / "interrupted"
    run_through(probe_cmd(mode, ckpt, ffcv_small, ref))
    code, resumed = interrupted_then_resumed(
        probe_cmd(mode, ckpt, ffcv_small, cut), cut, sig, lambda line: line.startswith("[probe] epoch 1/")
    )
    assert code == (75 if sig == signal.SIGUSR1 else -sig)
    assert "[probe] resumed from" in resumed
    same_run(ref, cut, "probe.json")


# --- a detection trial ------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1])
def test_detection_trial_resumes_exactly(synthetic_small, ckpt, tmp_path, sig):
    ref, cut = tmp_path / "uninterrupted", tmp_path / "interrupted"
    data = synthetic_small / "det"
    run_through(detect_cmd(ckpt, data, ref))
    code, resumed = interrupted_then_resumed(
        detect_cmd(ckpt, data, cut), cut, sig, lambda line: line.startswith("[detect] epoch 1/")
    )
    assert code == (75 if sig == signal.SIGUSR1 else -sig)
    assert "[detect] resumed from" in resumed
    same_run(ref, cut, "detect.json")


def test_another_world_size_does_not_resume(ckpt, tmp_path):
    """A state written by 2 ranks is another run's for 1 rank: set aside, not resumed."""
    from pipeline.runtime.distributed import DistEnv

    logged: list[str] = []
    two = checkpoint.StageState(tmp_path, {"seed": 1}, DistEnv(rank=0, world_size=2), logged.append)
    two.save(0, 1, {})
    one = checkpoint.StageState(tmp_path, {"seed": 1}, DistEnv(), logged.append)
    assert one.load() is None
    assert "world_size 2 -> 1" in logged[-1] and not (tmp_path / "last.pt").exists()
