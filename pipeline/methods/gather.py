"""The distributed pieces of MoCo: gathering keys and ShuffleBN.

In one process the gathers are the identity and the shuffle permutes the batch, which
matters only with split BatchNorm (pipeline.methods.split_bn): it moves each key into another
sub-batch than its query's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@torch.no_grad()
def gather_all(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank in rank order (no gradient flows back)."""
    if world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """``gather_all`` through which gradients flow back to every rank's input."""
    if world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x), dim=0)


def shuffle_across_ranks(x: torch.Tensor, gather=gather_all) -> tuple[torch.Tensor, torch.Tensor]:
    """ShuffleBN, step 1: give each rank a random slice of the global key batch.

    BatchNorm statistics of the key encoder then come from other samples than those of the
    query batch on the same rank, so the model cannot cheat through BN (MoCo paper, 3.3).
    Returns this rank's shuffled slice and the permutation needed to undo it.
    ``gather=gather_with_grad`` keeps the shuffle differentiable (end-to-end keys).
    """
    n_local = x.shape[0]
    x_all = gather(x)
    perm = torch.randperm(x_all.shape[0], device=x.device)
    if world_size() > 1:
        dist.broadcast(perm, src=0)  # every rank must apply the same permutation
    mine = perm.view(world_size(), n_local)[rank()]
    return x_all[mine], torch.argsort(perm)


def unshuffle_across_ranks(x: torch.Tensor, inverse_perm: torch.Tensor, gather=gather_all) -> torch.Tensor:
    """ShuffleBN, step 2: return each rank the outputs of its own samples, in order."""
    n_local = x.shape[0]
    x_all = gather(x)
    mine = inverse_perm.view(world_size(), n_local)[rank()]
    return x_all[mine]


def encode_shuffled(encoder, x: torch.Tensor, gather=gather_all) -> torch.Tensor:
    """ShuffleBN around an encoder: ``encoder(x)`` with the batch normalised in other BN
    batches (other ranks' slices, other split-BN sub-batches) than its order implies,
    returned in ``x``'s order."""
    shuffled, undo = shuffle_across_ranks(x, gather)
    return unshuffle_across_ranks(encoder(shuffled), undo, gather)
