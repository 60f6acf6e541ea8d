"""pipeline.pretrain: the Trainer and the stage on the small dataset: compile, a batch larger than
the training set, a diverged epoch, the kNN monitor without labels, a failed run reported."""

import pytest
import torch
from test_fast_path import BASE


def pretrain_cfg(**changes) -> dict:
    return {"data": {"crop_size": 32, "workers": 1}, "pretrain": {**BASE, **changes}}


def trainer(ffcv_small, tmp_path, **changes):
    from pipeline.pretrain import Job, Trainer
    from pipeline.runtime import distributed

    return Trainer(Job.of(pretrain_cfg(**changes)), ffcv_small, tmp_path / "state", distributed.init(), progress=False)


def test_pretrain_compile_wraps_the_network(ffcv_small, tmp_path):
    """pretrain.compile: the step runs the compiled network. Only the wrapping is checked:
    compiling the first step takes minutes on a CPU (Inductor builds C++), a GPU run's business."""
    t = trainer(ffcv_small, tmp_path, compile=True)
    assert isinstance(t.net, torch._dynamo.eval_frame.OptimizedModule) and t.net._orig_mod is t.model


def test_a_batch_larger_than_the_training_set_is_refused(ffcv_small, tmp_path):
    from pipeline.dag.config import ConfigError

    with pytest.raises(ConfigError, match=r"pretrain.batch_size=128 exceeds the training set \(80 images\)"):
        trainer(ffcv_small, tmp_path, batch_size=128)  # ffcv_small: 10 classes x 8 training images


def test_training_stops_at_the_first_diverged_epoch(ffcv_small, tmp_path, monkeypatch, capsys):
    t = trainer(ffcv_small, tmp_path, epochs=3)
    row = {"epoch": 1, "loss": float("nan"), "inst_acc": 0.0, "lr": 0.03, "seconds": 0.0}
    monkeypatch.setattr(t, "run_epoch", lambda skip: None)  # the epoch's steps are not the point
    monkeypatch.setattr(t, "epoch_row", lambda: dict(row))
    assert t.train() is False
    assert t.epoch == 1 and len(t.log_rows) == 1 and t.state_path.is_file()  # the diverged epoch is kept
    assert "loss diverged at epoch 1: stopping; the cell is reported as failed" in capsys.readouterr().out


def test_knn_monitor_without_labelled_training_images_is_nan(ffcv_small, tmp_path, monkeypatch):
    import math

    from pipeline import pretrain

    t = trainer(ffcv_small, tmp_path)
    unlabelled = (torch.randn(6, 4), torch.full((6,), -1))  # an unlabeled pretraining set: label -1
    monkeypatch.setattr(t, "eval_batches", lambda split: split)
    monkeypatch.setattr(pretrain, "features_of", lambda backbone, batches, device: unlabelled)
    assert math.isnan(t.knn_monitor())


def test_a_collapsed_run_is_reported_as_failed(ffcv_small, tmp_path, monkeypatch, capsys):
    """A run whose loss never diverged but whose last epoch sits at chance (failure() says so):
    the stage warns and its summary carries the failure, which the tables count."""
    from pipeline import pretrain

    monkeypatch.setattr(pretrain, "failure", lambda rows, method: "collapsed: loss 5.545 at chance")
    summary = pretrain.run(pretrain_cfg(), ffcv_small, tmp_path / "out", tmp_path / "state", progress=False)
    assert summary["failure"] == "collapsed: loss 5.545 at chance" and summary["diverged"] is False
    assert "warning: training failed (collapsed: loss 5.545 at chance); the cell is reported as failed" in (
        capsys.readouterr().out
    )


def test_a_key_encoder_that_misses_its_update_is_reported(ffcv_small, tmp_path, monkeypatch, capsys):
    """The key encoder never takes its momentum update: the stage's EMA replay sees it and
    warns, and the summary records the failed check."""
    from pipeline import pretrain
    from pipeline.methods import momentum_target

    monkeypatch.setattr(momentum_target, "momentum_update", lambda key, query, m: None)
    summary = pretrain.run(pretrain_cfg(), ffcv_small, tmp_path / "out", tmp_path / "state", progress=False)
    replay = summary["key_encoder"]["ema_replay"]
    assert summary["key_encoder"]["holds"] is False and replay["max_relative_error"] > replay["tolerance"]
    assert "warning: the key encoder check failed" in capsys.readouterr().out
