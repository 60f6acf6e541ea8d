"""MoCo across processes (2 gloo ranks on CPU): ShuffleBN in a BatchNorm model, identical
queues, and (with GroupNorm, which has no batch statistics to differ by) the same training as
one process at twice the batch."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.dag.config import section
from pipeline.methods.build import build_model, build_optimizer
from pipeline.methods.gather import shuffle_across_ranks, unshuffle_across_ranks

B, STEPS = 4, 3
P = {
    "method": "moco",
    "variant": "v2",
    "mechanism": "moco",
    "backbone": "resnet18",
    "width": 8,
    "cifar_stem": True,
    "norm": "gn",
    "dim": 16,
    "K": 32,
    "m": 0.9,
    "T": 0.2,
    "epochs": 1,
    "batch_size": 2 * B,
    "lr": 0.1,
    "weight_decay": 1e-4,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def global_batches():
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(2 * B, 3, 16, 16, generator=g),
            torch.randn(2 * B, 3, 16, 16, generator=g),
            torch.arange(2 * B) + 100 * s,
        )
        for s in range(STEPS)
    ]


def train(model, opt, batches, rows: slice, ddp=None):
    net = ddp or model
    for x1, x2, idx in batches:
        torch.manual_seed(7)  # ShuffleBN's permutation: the same on every rank (rank 0 broadcasts)
        loss, _, _ = net(x1[rows], x2[rows], idx[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()


def _two_rank_worker(rank, world, port, out):
    _init(rank, world, port)
    torch.manual_seed(0)
    model = build_model(section("pretrain", P), 16, 10, 1000)
    opt = build_optimizer(section("pretrain", P), model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    train(model, opt, global_batches(), slice(rank * B, (rank + 1) * B), ddp)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_ranks_equal_one_process_at_twice_the_batch(tmp_path):
    mp.spawn(_two_rank_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    torch.manual_seed(0)
    model = build_model(section("pretrain", P), 16, 10, 1000)
    opt = build_optimizer(section("pretrain", P), model.parameters())
    train(model, opt, global_batches(), slice(0, 2 * B))
    single = model.state_dict()
    for key in ("queue.keys", "queue.ptr", "queue.source", "queue.enqueued_at"):
        assert torch.equal(r0[key], r1[key]), f"{key} differs between ranks"
    assert r0["queue.source"].tolist()[: STEPS * 2 * B] == list(
        torch.cat([torch.arange(2 * B) + 100 * s for s in range(STEPS)]).tolist()
    )
    for key, value in single.items():
        torch.testing.assert_close(r0[key].float(), value.float(), rtol=1e-4, atol=1e-5, msg=key)
        torch.testing.assert_close(r1[key].float(), value.float(), rtol=1e-4, atol=1e-5, msg=key)


def _bn_worker(rank, world, port, out):
    """One MoCo v2 forward of a BatchNorm model on this rank's half of the global batch; what
    the key and query encoders saw and returned, and the logits."""
    _init(rank, world, port)
    torch.manual_seed(0)
    model = build_model(section("pretrain", {**P, "norm": "bn"}), 16, 10, 1000, world_size=world)
    seen = {}
    model.encoder_k.register_forward_hook(lambda m, args, out: seen.update(k_in=args[0], k_out=out))
    model.encoder_q.register_forward_hook(lambda m, args, out: seen.update(q_out=out))
    x1, x2, idx = global_batches()[0]
    rows = slice(rank * B, (rank + 1) * B)
    torch.manual_seed(7 + rank)  # each rank its own stream: only rank 0's broadcast can align them
    with torch.no_grad():
        _, _, logits = model(x1[rows], x2[rows], idx[rows])
    torch.save({**seen, "logits": logits, "shuffle_bn": model.shuffle_bn}, f"{out}/bn{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_shuffle_bn_in_a_batch_norm_model(tmp_path):
    """ShuffleBN by its definition (MoCo paper, 3.3): rank 0 draws a permutation of the global
    key batch; rank r's key encoder (its BN) normalises slice r of it; each query meets the key
    of its own image, wherever that image was encoded."""
    mp.spawn(_bn_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"bn{r}.pt") for r in (0, 1)]
    assert all(r["shuffle_bn"] for r in ranks)  # BatchNorm: the guard is on
    _, x2, _ = global_batches()[0]
    torch.manual_seed(7)
    perm = torch.randperm(2 * B)  # rank 0's draw: its seed, the forward's first random numbers
    for r, seen in enumerate(ranks):
        mine = perm[r * B : (r + 1) * B]
        assert torch.equal(seen["k_in"], x2[mine])  # the BN batch: slice r of the permutation
        assert set(mine.tolist()) != set(range(r * B, (r + 1) * B))  # ... not this rank's own images
    # keys in the order of the global batch: key of image perm[j] is row j of the encoded slices
    keys = torch.nn.functional.normalize(torch.cat([seen["k_out"] for seen in ranks]), dim=1)[perm.argsort()]
    for r, seen in enumerate(ranks):
        q = torch.nn.functional.normalize(seen["q_out"], dim=1)
        positives = (q * keys[r * B : (r + 1) * B]).sum(1) / P["T"]
        torch.testing.assert_close(seen["logits"][:, 0], positives)


def _shuffle_worker(rank, world, port, out):
    _init(rank, world, port)
    torch.manual_seed(3)
    x = torch.arange(8, dtype=torch.float32)[:, None] + 100 * rank  # rank-identifying rows
    shuffled, undo = shuffle_across_ranks(x)
    restored = unshuffle_across_ranks(shuffled, undo)
    torch.save({"x": x, "shuffled": shuffled, "restored": restored}, f"{out}/shuffle{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_shuffle_bn_across_two_ranks(tmp_path):
    mp.spawn(_shuffle_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"shuffle{r}.pt") for r in (0, 1)]
    everything = sorted(torch.cat([p["shuffled"] for p in parts]).flatten().tolist())
    assert everything == sorted(torch.cat([p["x"] for p in parts]).flatten().tolist())  # a permutation
    for p in parts:
        assert torch.equal(p["restored"], p["x"])  # unshuffle(shuffle(x)) is the identity
        # the batch the key encoder's BN sees on this rank is not this rank's query batch
        assert not torch.equal(p["shuffled"].sort(0).values, p["x"])
        assert bool((p["shuffled"] >= 100).any() & (p["shuffled"] < 100).any())


def test_shuffle_is_identity_in_one_process():
    x = torch.randn(6, 3)
    torch.manual_seed(0)
    shuffled, undo = shuffle_across_ranks(x)
    assert torch.equal(unshuffle_across_ranks(shuffled, undo), x)


def fake_gpus(monkeypatch, count: int, local_rank: int):
    from pipeline.runtime import distributed

    for name in ("RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return distributed


def test_a_rank_without_its_gpu_is_refused(monkeypatch):
    distributed = fake_gpus(monkeypatch, count=1, local_rank=1)
    with pytest.raises(RuntimeError, match=r"local rank 1 has no GPU: this node's job sees 1 GPU"):
        distributed.init()


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    """The process group as NCCL set it up (already initialised: rank 3 of 4)."""
    distributed = fake_gpus(monkeypatch, count=2, local_rank=1)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 4)
    env = distributed.init()
    assert chosen == [1] and (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
