"""The replay of a detection trial from its resume state (python -m pipeline.bench divergence):
on the trial's own path it repeats the trial's steps exactly, on the other it is a replay in
the other precision, and it stops at the first loss that is not finite."""

import json
import shutil

import pytest
import torch
from test_detect import TINY, ckpt_path, det_dir  # noqa: F401 (fixtures)

from pipeline.bench import divergence
from pipeline.runtime import checkpoint
from pipeline.transfer import trial

STEPS_PER_EPOCH = 4  # 16 scenes in batches of 4


@pytest.fixture(scope="module")
def trial_states(det_dir, ckpt_path, tmp_path_factory, request):  # noqa: F811 (fixtures)
    """A 2-epoch trial in fp32 that saved its state every 2 steps: each state as it was saved
    (by epoch and step), and the trial's metrics."""
    folder = tmp_path_factory.mktemp("trial")
    copies = {}
    save = checkpoint.StageState.save

    def keep_a_copy(self, epoch, step, *args, **kwargs):
        save(self, epoch, step, *args, **kwargs)
        copies[epoch, step] = shutil.copy(self.path, folder / f"{epoch}-{step}.pt")

    monkeypatch = pytest.MonkeyPatch()
    request.addfinalizer(monkeypatch.undo)
    monkeypatch.setattr(checkpoint.StageState, "save", keep_a_copy)
    cfg = {"detect": {**TINY, "epochs": 2, "fast_path": "off", "checkpoint_every": 2}}
    metrics = trial.run(cfg, ckpt_path, det_dir, folder / "trial.json", None, folder / "state")
    monkeypatch.undo()
    return {at: checkpoint.load(path) for at, path in copies.items()}, checkpoint.load(ckpt_path), metrics


@pytest.fixture(scope="module")
def after_epoch_1(trial_states):
    states, ckpt, metrics = trial_states
    return states[1, 0], ckpt, metrics


def test_the_replay_on_the_trials_path_is_its_second_epoch(after_epoch_1, det_dir):  # noqa: F811
    state, ckpt, metrics = after_epoch_1
    rows = divergence.replay(state, ckpt, det_dir, bf16=False, steps=STEPS_PER_EPOCH)
    assert [row["iteration"] for row in rows] == [5, 6, 7, 8]
    # the trial logs each epoch's mean loss (5 decimals): the replayed steps give epoch 2's
    assert round(sum(row["loss"] for row in rows) / len(rows), 5) == metrics["train_loss"][1]
    for row in rows:
        assert row["loss"] == pytest.approx(sum(row["losses"].values()), rel=1e-6)
        assert set(row["losses"]) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
        assert row["grad_norm"] > 0


def test_a_replay_from_mid_epoch_ends_the_epoch_as_the_trial_did(trial_states, det_dir):  # noqa: F811
    states, ckpt, metrics = trial_states
    state = states[0, 2]  # after steps 1 and 2 of epoch 1, whose losses the state holds
    rows = divergence.replay(state, ckpt, det_dir, bf16=False, steps=2)
    assert [row["iteration"] for row in rows] == [3, 4]
    epoch_1 = [*state["ranks"][0]["losses"], *(row["loss"] for row in rows)]
    assert round(sum(epoch_1) / len(epoch_1), 5) == metrics["train_loss"][0]


def test_the_other_path_replays_the_same_steps_in_bf16(after_epoch_1, det_dir):  # noqa: F811
    state, ckpt, _ = after_epoch_1
    fp32 = divergence.replay(state, ckpt, det_dir, bf16=False, steps=2)
    bf16 = divergence.replay(state, ckpt, det_dir, bf16=True, steps=2)
    assert [(r["iteration"], r["lr"]) for r in bf16] == [(r["iteration"], r["lr"]) for r in fp32]
    # the same weights and batch: bf16 rounds the features, and so may pick other proposals
    assert bf16[0]["loss"] != fp32[0]["loss"] and all(0 < r["loss"] < float("inf") for r in bf16)
    assert divergence.replay(state, ckpt, det_dir, bf16=False, steps=2) == fp32  # the state is only read


def test_a_replay_stops_at_the_first_loss_that_is_not_finite(after_epoch_1, det_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    state, ckpt, _ = after_epoch_1
    path = tmp_path / "last.pt"
    torch.save(state, path)
    monkeypatch.chdir(tmp_path)
    ckpt_file = tmp_path / "checkpoint.pt"
    torch.save(ckpt, ckpt_file)
    args = ["--state", str(path), "--checkpoint", str(ckpt_file), "--data", str(det_dir), "--steps", "4"]
    result = divergence.main([*args, "--lr", "1e6"])
    for rows in result["paths"].values():
        assert len(rows) < 4 and "grad_norm" not in rows[-1]  # stopped where the loss left the floats
        assert all(row["loss"] < float("inf") for row in rows[:-1])
    assert "not finite: stopped" in capsys.readouterr().out
    assert json.loads((tmp_path / "bench" / "out" / "divergence.json").read_text())["lr"] == 1e6
    with pytest.raises(SystemExit, match="not a detection trial's resume state"):
        divergence.main(["--state", str(ckpt_file), "--checkpoint", str(ckpt_file), "--data", str(det_dir)])
