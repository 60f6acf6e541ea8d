"""How a job spends its CPUs: torch threads and data-loader workers, decided here only.

A job's CPU count is its stage's ``threads`` key (pretrain, probe, detect), which is also
what Snakemake reserves for the job (``threads:``, cpus-per-task under SLURM). It is capped
at the CPUs this process may run on.

- On a GPU the model runs on the device; the CPUs decode and crop: one torch thread, the
  rest loader workers.
- On a CPU the model takes every thread. The FFCV loader keeps one worker, which is not given
  a core of its own: decoding and cropping are 0.4% of a pretraining epoch of the embedded
  demo (``python -m pipeline.bench epoch``), so its thread is idle nearly all the time.

Measured with ``python -m pipeline.bench cores`` (AMD EPYC, AVX2, no AVX-512, 2 cores): two
single-thread pretraining jobs together train 1.78x the steps per second of one job on two
threads, so the demo runs its jobs on one thread each, as many at once as there are cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Threads:
    torch: int  # torch.set_num_threads
    loader: int  # FFCV num_workers / DataLoader processes


def available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def plan(job_cpus: int, device_type: str = "cpu", loader_workers: int | None = None) -> Threads:
    """The split of ``job_cpus`` (capped at the available CPUs); ``loader_workers`` (data.workers)
    overrides the loader's share when set."""
    cpus = max(1, min(int(job_cpus), available()))
    if device_type == "cuda":
        loader = loader_workers or max(1, cpus - 1)
        return Threads(torch=max(1, cpus - loader), loader=loader)
    return Threads(torch=cpus, loader=loader_workers or 1)


def use(job_cpus: int, device_type: str = "cpu", loader_workers: int | None = None) -> Threads:
    """Apply the plan to this process (torch's thread count) and return it."""
    import torch

    threads = plan(job_cpus, device_type, loader_workers)
    torch.set_num_threads(threads.torch)
    return threads
