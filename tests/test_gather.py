"""pipeline.methods.gather across two gloo ranks: gradients flow through the gather, and the memory
bank draws the same negatives on every rank."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_distributed import _init, free_port
from test_moco import tiny_model, views


def _two_rank_gather_worker(rank, world, port, out):
    from pipeline.methods.gather import gather_with_grad

    _init(rank, world, port)
    x = torch.full((2, 1), rank + 1.0, requires_grad=True)
    gathered = gather_with_grad(x)
    (gathered * torch.arange(4.0)[:, None]).sum().backward()
    bank = tiny_model(mechanism="memory_bank", K=16)  # the same bank on every rank (seed 0)
    torch.manual_seed(10 + rank)  # the draw of negatives, different on each rank unless shared
    x1, _ = views(4)
    _, _, logits = bank(x1, x1, torch.arange(4))
    torch.save({"gathered": gathered.detach(), "grad": x.grad, "logits": logits.detach()}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_ranks_share_gathered_keys_gradients_and_bank_negatives(tmp_path):
    mp.spawn(_two_rank_gather_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for r in (r0, r1):
        assert r["gathered"].flatten().tolist() == [1.0, 1.0, 2.0, 2.0]  # rank 0's rows, then rank 1's
    # d(sum_i w_i * gathered_i)/dx on each rank, w = 0, 1, 2, 3: both ranks' sums flow back to
    # the rows they gathered, each rank's own rows: 2 x (0, 1) and 2 x (2, 3)
    assert r0["grad"].flatten().tolist() == [0.0, 2.0] and r1["grad"].flatten().tolist() == [4.0, 6.0]
    # the same queries and bank on both ranks: equal logits only if the negatives are the same
    assert torch.equal(r0["logits"], r1["logits"])
