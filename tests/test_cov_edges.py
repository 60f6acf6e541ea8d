"""Edge cases the other tests leave unexecuted: each asserts what the line it reaches gives."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch


def test_seeds_to_decide_gives_up_beyond_max_seeds():
    from pipeline.report.stats import MAX_SEEDS, Estimate, seeds_to_decide

    # mean 0.01, std 10: t * 10 / sqrt(n) < 0.01 needs sqrt(n) > 1000 t, n > 10^6 (t > 1.96)
    # -> more than MAX_SEEDS (10,000): nothing can be said
    assert MAX_SEEDS < 10**6
    assert seeds_to_decide(Estimate(mean=0.01, half=1.0, n=3, std=10.0)) is None
    assert seeds_to_decide(Estimate(mean=-0.01, half=1.0, n=3, std=10.0)) is None


def test_polygons_decode_to_their_union():
    from pipeline.eval.masks import decode

    a = [0, 0, 4, 0, 4, 4, 0, 4]  # square (0,0)-(4,4): pycocotools fills rows/cols 0..3, 16 pixels
    b = [5, 5, 8, 5, 8, 8, 5, 8]  # square (5,5)-(8,8): rows/cols 5..7, 9 pixels
    one = decode([a], 10, 10)
    assert one.shape == (10, 10) and one.dtype == np.uint8
    assert one.sum() == 16 and one[:4, :4].all()
    both = decode([a, b], 10, 10)
    assert both.sum() == 16 + 9  # disjoint: the union's area is the sum
    assert both[:4, :4].all() and both[5:8, 5:8].all()


def test_uncompressed_rle_decodes():
    from pipeline.eval.masks import decode

    # column-major counts: 5 zeros, 3 ones (column 1, rows 1..3), 8 zeros
    mask = decode({"size": [4, 4], "counts": [5, 3, 8]}, 4, 4)
    expected = np.zeros((4, 4), np.uint8)
    expected[1:4, 1] = 1
    assert np.array_equal(mask, expected)


def test_the_repair_refuses_dag_settings_without_target_jobs():
    from pipeline.dag.target_jobs import check_snakemake

    @dataclasses.dataclass
    class NoTargetJobs:  # a stand-in for DAGSettings that lost the field
        targets: tuple = ()

    def init(self, workflow):  # the right signature, so only the settings are the problem
        pass

    with pytest.raises(RuntimeError, match=r"cannot repair.*its DAG settings have no target_jobs\)") as err:
        check_snakemake("9.27.1", init, NoTargetJobs)
    assert "version" not in str(err.value) and "workflow first" not in str(err.value)


def test_train_cached_fits_a_probe_on_cached_features():
    from pipeline.dag.config import section
    from pipeline.probe import LinearProbe, settings, train_cached

    torch.manual_seed(0)
    pc = section("probe", {"epochs": 2, "batch_size": 8})
    s = settings(pc, {"backbone": "resnet18"})
    assert s["epochs"] == 2 and s["batch_size"] == 8
    # two well separated classes: feature 0 carries the label
    y = torch.arange(32) % 2
    x = torch.randn(32, 4) * 0.1
    x[:, 0] += y.float() * 2 - 1
    probe = LinearProbe(4, 2, s, pc.standardize, 32 // 8)
    curve = train_cached(probe, x, y, x, y, pc.seed)
    assert [p["epoch"] for p in curve] == [1, 2]  # one point per epoch
    assert all(set(p) == {"epoch", "train_loss", "val_top1"} for p in curve)
    assert probe.step == 2 * 4  # 2 epochs x 32 / 8 batches


def test_data_identity_without_a_report(tmp_path):
    from pipeline.data.loaders import data_identity

    assert data_identity(tmp_path) == {"train.json content": None}  # no train.json: a hand-made .beton
    (tmp_path / "train.json").write_text(json.dumps({"classes": 2}))
    assert data_identity(tmp_path)["train.json content"] is not None


def test_epoch_seeded_has_its_datasets_length():
    from pipeline.transfer.data import EpochSeeded
    from pipeline.transfer.train import to_device

    data = torch.utils.data.TensorDataset(torch.arange(7))
    wrapped = EpochSeeded(data, seed=3)
    assert len(wrapped) == 7
    assert wrapped[(0, 4)][0].item() == 4  # keyed (epoch, index)
    images, targets = to_device([torch.zeros(1)], [{"boxes": torch.ones(1), "id": 5}], "cpu")
    assert images[0].device.type == "cpu" and targets[0]["boxes"].device.type == "cpu" and targets[0]["id"] == 5
