"""The augmented probe on several ranks (probe.ranks; gloo on CPU): the views sharded so that
every labelled image is seen once an epoch, the classifier trained as one process at the whole
batch, and the stage under torchrun writing one result."""

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import REPO
from test_distributed import _init, free_port
from test_probe import random_checkpoint  # noqa: F401  (a fixture)
from torch import nn

from pipeline.dag.config import ConfigError, load_stage_config
from pipeline.data.loaders import LOADERS, Reading, Views, batches_from, crop_loader
from pipeline.probe import LinearProbe, make_classifier, per_rank_batch, run, synced

pytestmark = pytest.mark.integration  # a stage run as processes: make test-quick leaves it out

DIM, CLASSES, BATCH, STEPS = 6, 3, 8, 4
SETTINGS = {"lr": 0.5, "batch_size": BATCH, "schedule": "cosine", "weight_decay": 1e-4, "epochs": 1}


def global_batches():
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(BATCH, DIM, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(STEPS)
    ]


def trained(rows: slice) -> dict:
    torch.manual_seed(0)  # the classifier's init: the same on every rank
    probe = LinearProbe(DIM, CLASSES, SETTINGS, standardize=False, steps_per_epoch=STEPS)
    for feats, labels in global_batches():
        probe.train_batch(feats[rows], labels[rows])
    return {k: v.clone() for k, v in probe.classifier.state_dict().items()}


def _classifier_worker(rank, world, port, out):
    _init(rank, world, port)
    half = BATCH // world
    torch.save(trained(slice(rank * half, (rank + 1) * half)), f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_train_the_classifier_as_one_process_at_the_whole_batch(tmp_path):
    # each rank takes half of every step's batch; DDP averages the gradients of the two halves'
    # mean losses: the mean loss over the whole batch, so the same SGD steps as one process
    mp.spawn(_classifier_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    single = trained(slice(0, BATCH))
    for r in (0, 1):
        ranked = torch.load(tmp_path / f"rank{r}.pt")
        for key, value in single.items():
            torch.testing.assert_close(ranked[key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert not torch.equal(single["weight"], trained(slice(0, BATCH // 2))["weight"])  # half a batch differs


def _shard_worker(rank, world, port, path, loader, labelled, out):
    _init(rank, world, port)
    views = crop_loader(
        path, Views(crop_size=32, seed=5), Reading(batch_size=4, workers=1, loader=loader, distributed=True), labelled
    )
    seen = {e: [int(i) for _, _, idx in batches_from(views, 0, e) for i in idx] for e in (0, 1)}
    torch.save({"seen": seen, "steps": len(views)}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("loader", LOADERS)
def test_each_epoch_shards_the_labelled_images_over_the_ranks(ffcv_small, tmp_path, loader):
    # 13 labelled images over 2 ranks: 7 each (one repeated to even the shards, as a
    # DistributedSampler), 2 steps of 4 on both ranks; every image seen each epoch, in a new order
    labelled = list(range(0, 26, 2))
    args = (2, free_port(), str(ffcv_small / "train.beton"), loader, labelled, str(tmp_path))
    mp.spawn(_shard_worker, args=args, nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["steps"] == r1["steps"] == 2
    for e in (0, 1):
        both = r0["seen"][e] + r1["seen"][e]
        assert len(r0["seen"][e]) == len(r1["seen"][e]) == 7
        assert set(both) == set(labelled) and len(both) == 14
    assert r0["seen"][0] != r0["seen"][1]


def probe_config(ranks: int, **probe) -> dict:
    return {
        "data": {"crop_size": 32, "workers": 1},
        "probe": {"mode": "augmented", "epochs": 2, "batch_size": 32, "threads": 1, "ranks": ranks, **probe},
    }


@pytest.mark.timeout(600)
def test_two_ranks_probe_through_torchrun(ffcv_small, random_checkpoint, tmp_path):  # noqa: F811
    out = tmp_path / "probe.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    args = ["--config", json.dumps(probe_config(2)), "--checkpoint", str(random_checkpoint)]
    args += ["--data", str(ffcv_small), "--out", str(out), "--state", str(tmp_path / "state")]
    proc = subprocess.run([*cmd, "pipeline.probe", *args], cwd=REPO, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["ranks"] == 2 and m["settings"]["batch_size"] == 32 and len(m["curve"]) == 2
    assert 0 <= m["top1"] <= 100 and 0 <= m["knn_top1"] <= 100
    assert proc.stdout.count("[probe] top1=") == 1 and proc.stdout.count("epoch 2/2") == 1  # rank 0 logs
    assert not (tmp_path / "state" / "last.pt").exists()  # retired once the result exists


def test_the_ranks_must_be_the_configs(ffcv_small, random_checkpoint, tmp_path):  # noqa: F811
    # probe.ranks is part of the result: a run with another number of processes is refused
    with pytest.raises(ConfigError, match="probe.ranks=2, but 1 processes run this probe"):
        run(probe_config(2), random_checkpoint, ffcv_small, tmp_path / "probe.json")


@pytest.mark.parametrize(
    "probe, message",
    [
        ({"mode": "cached"}, "probe.ranks=2 needs probe.mode: augmented"),
        ({"batch_size": 33}, "probe.batch_size=33 is not a multiple of probe.ranks=2"),
    ],
)
def test_ranks_the_probe_cannot_split_fail_at_config_time(probe, message):
    with pytest.raises(ConfigError, match=message):
        load_stage_config(probe_config(2, **probe), ["data", "probe"])


def test_the_standardised_classifier_syncs_its_bn_on_gpus_only():
    # convert_sync_batchnorm only swaps module types: it runs without a GPU
    assert isinstance(synced(make_classifier(4, 2, True), torch.device("cuda"))[0], nn.SyncBatchNorm)
    assert type(synced(make_classifier(4, 2, True), torch.device("cpu"))[0]) is nn.BatchNorm1d
    with pytest.raises(ConfigError, match="the probe's batch of 256 is not a multiple of probe.ranks=3"):
        per_rank_batch(256, 3)  # the protocol's batch, which the config check cannot see
