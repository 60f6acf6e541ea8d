"""Process-group setup from torchrun's or SLURM's environment; one code path for all."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.runtime.stage_log import is_main_process as is_main_process  # rank 0 logs and writes


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host: str = socket.gethostname()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _export_slurm_env() -> None:
    """Inside an srun task with several tasks: derive RANK, WORLD_SIZE, MASTER_* from SLURM."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    from submitit.helpers import TorchDistributedEnvironment

    # submitit reads its own variable to know it runs under SLURM (plain srun does not set it);
    # keep every GPU visible: the rank picks its own with LOCAL_RANK.
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def rank_device(local_rank: int = 0) -> torch.device:
    """This rank's GPU (its local rank's) when the job has GPUs, else the CPU."""
    return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")


def init() -> DistEnv:
    """Initialise torch.distributed when several processes run (gloo on CPU, nccl on GPU)."""
    _export_slurm_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    if world <= 1:
        return DistEnv(host=node)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl" and local >= torch.cuda.device_count():
        raise RuntimeError(
            f"local rank {local} has no GPU: this node's job sees {torch.cuda.device_count()} "
            "GPU(s), one per rank is needed (the profile's gres for this rule, e.g. gpu:<ranks>)"
        )
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(local)
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, host=node)


def gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (a one-element list in one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def bn_statistics(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The BN running means and variances of a model, by state-dict name."""
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            out[f"{name}.running_mean"] = module.running_mean  # type: ignore[assignment]  # tracked: a tensor
            out[f"{name}.running_var"] = module.running_var  # type: ignore[assignment]
    return out


@torch.no_grad()
def average_bn_statistics(model: torch.nn.Module) -> None:
    """Average BN running statistics over ranks. Each rank normalises its own batches, so
    the statistics drift apart; averaging them at epoch ends makes every rank's encoder (and
    its kNN monitor, and the checkpoint) the same."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for buf in bn_statistics(model).values():
        dist.all_reduce(buf)
        buf /= dist.get_world_size()


def ddp_device_ids(device: torch.device) -> list[int] | None:
    """DDP's device_ids: the rank's one GPU; None on CPU (DDP rejects ids for CPU modules)."""
    return [device.index] if device.type == "cuda" else None


def ddp(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` under DistributedDataParallel when several ranks run (its gradients averaged
    over them at each backward), else itself."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return module
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ddp_device_ids(device))


def check_ranks_agree(module: torch.nn.Module, what: str) -> None:
    """DDP keeps every rank's weights equal; a rank that drifted would make the result depend
    on which rank evaluates: fail instead."""
    sums = gather_objects(sum(float(p.detach().double().sum()) for p in module.parameters()))
    if len(set(sums)) > 1:
        raise RuntimeError(f"{what} weights differ across ranks after training: checksums {sums}")


def sum_over_ranks(*values: float) -> list[float]:
    """Each of ``values`` summed over the ranks (themselves in one process)."""
    return [sum(col) for col in zip(*gather_objects(values))]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
