"""Exact resume: a run killed with SIGKILL and restarted ends bit-identical to an
uninterrupted run (weights, queue, optimizer, log)."""
import json
import signal
import subprocess
import sys
import time

import torch

from conftest import REPO

CFG = {"data": {"crop_size": 32, "workers": 1, "crop": "device"},
       "pretrain": {"method": "moco", "variant": "v2", "backbone": "resnet18", "width": 8, "cifar_stem": True,
                    "dim": 16, "K": 32, "m": 0.99, "T": 0.2, "epochs": 3, "batch_size": 16, "lr": 0.05,
                    "threads": 1, "checkpoint_every": 1, "seed": 3}}


def command(data, out, state):
    return [sys.executable, "-m", "pipeline.pretrain", "--config", json.dumps(CFG), "--data", str(data),
            "--out", str(out), "--state", str(state), "--no-progress"]


def test_kill_and_resume_is_exact(ffcv_small, tmp_path):
    subprocess.run(command(ffcv_small, tmp_path / "a", tmp_path / "a_state"), cwd=REPO, check=True,
                   capture_output=True, timeout=300)

    state = tmp_path / "b_state"
    proc = subprocess.Popen(command(ffcv_small, tmp_path / "b", state), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (state / "last.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # somewhere in the middle of training
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (tmp_path / "b" / "checkpoint.pt").exists(), "the run finished before it was killed"
    saved = torch.load(state / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["step_in_epoch"]) != (CFG["pretrain"]["epochs"], 0)

    resumed = subprocess.run(command(ffcv_small, tmp_path / "b", state), cwd=REPO, check=True,
                             capture_output=True, text=True, timeout=300)
    assert "resumed from" in resumed.stdout

    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs after resume"
    assert torch.equal(a["model"]["queue.keys"], b["model"]["queue.keys"])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a["log"]) == strip(b["log"])
