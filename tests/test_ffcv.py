"""FFCV round trip: what was written is what is read, every sample once per epoch, in one
process and across two gloo ranks (each rank reads its own shard; the epoch sets the order)."""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.data.loaders import LOADERS, Centre, Reading, Views, eval_loader, two_view_loader
from pipeline.data.sources import decode_file, open_source


def test_round_trip_labels_indices_pixels(synthetic_small, ffcv_small):
    src = open_source("imagefolder", synthetic_small / "cls" / "train")
    images, labels, indices = [], [], []
    for x, y, i in eval_loader(ffcv_small / "train.beton", Centre(crop_size=32), Reading(batch_size=16, workers=1)):
        images.append(x.clone()), labels.append(y.clone()), indices.append(i.clone())
    images, labels, indices = torch.cat(images), torch.cat(labels), torch.cat(indices)
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
    assert indices.tolist() == list(range(len(src)))
    assert labels.tolist() == src.labels
    # raw write mode, 32 px images at 32 px crop: pixels come back exactly.
    for k in (0, len(src) // 2, len(src) - 1):
        expect = torch.from_numpy(decode_file(src.items[k])).permute(2, 0, 1)
        assert torch.equal(images[k], expect)
    report = json.loads((ffcv_small / "train.json").read_text())
    assert report["num_samples"] == len(src) and report["classes"] == src.classes


def test_two_views_every_sample_once(ffcv_small):
    loader = two_view_loader(
        ffcv_small / "train.beton", Views(crop_size=24), Reading(batch_size=8, workers=1, drop_last=False)
    )
    seen = []
    for v1, v2, _y, idx in loader:
        assert v1.shape == v2.shape and v1.shape[1:] == (3, 24, 24)
        assert not torch.equal(v1, v2)  # independent random crops
        seen += idx.tolist()
    assert sorted(seen) == list(range(80))
    assert len(set(seen)) == len(seen)


def test_iterating_keeps_the_stages_torch_threads(ffcv_small):
    """FFCV's Loader sets torch's thread count to its workers at every epoch; a job that asked
    for 1 torch thread and 2 loader workers must still train on 1 thread."""
    before = torch.get_num_threads()
    try:
        beton = ffcv_small / "train.beton"
        makers = (
            lambda: two_view_loader(beton, Views(crop_size=16), Reading(batch_size=8, workers=2, threads=1)),
            lambda: eval_loader(beton, Centre(crop_size=16), Reading(batch_size=8, workers=2, threads=1)),
        )
        for make in makers:
            torch.set_num_threads(1)
            loader = make()
            for _epoch in range(2):
                for _batch in loader:
                    assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank, world, port, beton, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    seen = {}
    for kind in LOADERS:
        loader = two_view_loader(
            beton,
            Views(crop_size=16, seed=5),
            Reading(batch_size=8, workers=1, distributed=True, drop_last=False, loader=kind),
        )
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen[f"{kind}/{epoch}"] = [i for *_, idx in loader.batches() for i in idx.tolist()]
        seen[f"{kind}/len"] = len(loader)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()


# several ranks, forked: once hung in make test-quick's order (docs/studies/2026-12-05-suite-time.md)
@pytest.mark.integration
def test_two_gloo_ranks_share_every_sample_once(ffcv_small, tmp_path):
    # fork: the ranks inherit the imported torch and FFCV (spawning re-imports them: minutes
    # on a busy 2-core machine); each still compiles its own FFCV Loader.
    mp.start_processes(
        _rank_worker,
        args=(2, free_port(), str(ffcv_small / "train.beton"), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="fork",
    )
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for kind in LOADERS:
        assert r0[f"{kind}/len"] == r1[f"{kind}/len"] == 40 // 8
        for epoch in (0, 1):
            a, b = r0[f"{kind}/{epoch}"], r1[f"{kind}/{epoch}"]
            assert len(a) == len(b) == 40 and not set(a) & set(b)  # disjoint shards
            assert sorted(a + b) == list(range(80))  # together: every sample once
        assert r0[f"{kind}/0"] != r0[f"{kind}/1"]  # the epoch sets the order
    for epoch in (0, 1):  # both loaders shard and order alike
        assert r0[f"ffcv/{epoch}"] == r0[f"torchvision/{epoch}"] and r1[f"ffcv/{epoch}"] == r1[f"torchvision/{epoch}"]
