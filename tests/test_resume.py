"""Exact resume: a run killed with SIGKILL and restarted ends bit-identical to an
uninterrupted run (weights, queue, optimizer, log), with the default seeded FFCV crops and
the BN-leak guard's split BN and key shuffle."""

import json
import signal
import subprocess
import sys

import pytest
import torch
from conftest import REPO

pytestmark = pytest.mark.integration  # a stage run as processes: make test-quick leaves it out

CFG = {
    "data": {"crop_size": 32, "workers": 2, "crop": "loader"},
    "pretrain": {
        "method": "moco",
        "variant": "v2",
        "backbone": "resnet18",
        "width": 8,
        "cifar_stem": True,
        "dim": 16,
        "K": 32,
        "m": 0.99,
        "T": 0.2,
        "epochs": 3,
        "batch_size": 16,
        "lr": 0.05,
        "threads": 1,
        "checkpoint_every": 1,
        "seed": 3,
    },
}


def command(data, out, state):
    return [
        sys.executable,
        "-m",
        "pipeline.pretrain",
        "--config",
        json.dumps(CFG),
        "--data",
        str(data),
        "--out",
        str(out),
        "--state",
        str(state),
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def uninterrupted(ffcv_small, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    subprocess.run(
        command(ffcv_small, out / "run", out / "state"), cwd=REPO, check=True, capture_output=True, timeout=300
    )
    return torch.load(out / "run" / "checkpoint.pt", weights_only=True)


def interrupt(ffcv_small, out, state, sig) -> subprocess.CompletedProcess:
    """Start a run, send ``sig`` once it has logged its first epoch (two of three remain), then
    restart it."""
    proc = subprocess.Popen(
        command(ffcv_small, out, state), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:  # the end of epoch 1 (its log row) marks the point
        lines.append(line)
        if line.startswith("[pretrain] epoch=1 "):
            break
    else:
        raise AssertionError(f"the run ended before its first epoch:\n{''.join(lines)[-3000:]}")
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    first_output = "".join(lines) + rest
    assert not (out / "checkpoint.pt").exists(), "the run finished before it was interrupted"
    saved = torch.load(state / "last.pt", weights_only=True)
    # past the first epoch's last step or later (checkpoint_every: 1), short of the end
    assert (0, 1) <= (saved["epoch"], saved["step_in_epoch"]) < (CFG["pretrain"]["epochs"], 0)
    resumed = subprocess.run(
        command(ffcv_small, out, state), cwd=REPO, check=True, capture_output=True, text=True, timeout=300
    )
    assert "resumed from" in resumed.stdout
    return proc.returncode, first_output


def assert_same_run(a, b):
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs after resume"
    assert torch.equal(a["model"]["queue.keys"], b["model"]["queue.keys"])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a["log"]) == strip(b["log"])


def test_sigkill_then_resume_is_exact(ffcv_small, uninterrupted, tmp_path):
    code, _ = interrupt(ffcv_small, tmp_path / "b", tmp_path / "b_state", signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert_same_run(uninterrupted, torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True))


def test_preemption_signal_saves_and_resumes_exactly(ffcv_small, uninterrupted, tmp_path):
    """SLURM's warning signal (USR1): the run saves its state at the next step and exits 75."""
    code, output = interrupt(ffcv_small, tmp_path / "c", tmp_path / "c_state", signal.SIGUSR1)
    assert code == 75, output
    assert "SIGUSR1 received: state saved" in output
    assert_same_run(uninterrupted, torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=True))


def test_cuda_rng_streams_are_saved_and_restored(monkeypatch, capsys):
    """The CUDA generators (key shuffle, memory-bank draws) travel in the resume state, tested by
    its logic on CPU: every device's stream is saved, and each is put back on its device."""
    import io

    from pipeline.runtime import checkpoint

    streams = [torch.full((16,), 7, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in streams])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(device, state))
    buffer = io.BytesIO()
    torch.save(checkpoint.rng_state(), buffer)  # as the resume state is written and read
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    checkpoint.set_rng_state(state)
    assert sorted(restored) == [0, 1] and all(torch.equal(restored[d], streams[d]) for d in (0, 1))
    assert "warning" not in capsys.readouterr().out
    # resumed where the process sees one device: that one is restored, and the log says so
    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    checkpoint.set_rng_state(state)
    assert list(restored) == [0] and "this process sees 1" in capsys.readouterr().out
    # a state written without CUDA (or before the CUDA streams were saved) restores the CPU ones
    restored.clear()
    checkpoint.set_rng_state({k: v for k, v in state.items() if k != "cuda"})
    assert restored == {}
