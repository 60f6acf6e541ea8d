"""pipeline.runtime.cpus: one place decides how a job's CPUs are split between torch and the loader."""

import pytest

from pipeline.runtime import cpus


@pytest.fixture
def four_cpus(monkeypatch):
    monkeypatch.setattr(cpus, "available", lambda: 4)


def test_on_cpu_the_model_takes_every_thread_and_the_loader_one_worker(four_cpus):
    assert cpus.plan(1) == cpus.Threads(torch=1, loader=1)
    assert cpus.plan(2) == cpus.Threads(torch=2, loader=1)


def test_on_gpu_the_cpus_decode(four_cpus):
    assert cpus.plan(4, "cuda") == cpus.Threads(torch=1, loader=3)
    assert cpus.plan(1, "cuda") == cpus.Threads(torch=1, loader=1)


def test_a_job_never_plans_more_threads_than_the_machine_has(four_cpus):
    assert cpus.plan(16) == cpus.Threads(torch=4, loader=1)
    threads = cpus.plan(16, "cuda")
    assert threads.torch + threads.loader == 4


def test_explicit_loader_workers_take_their_share_first(four_cpus):
    assert cpus.plan(4, "cuda", loader_workers=2) == cpus.Threads(torch=2, loader=2)
    assert cpus.plan(2, "cpu", loader_workers=3) == cpus.Threads(torch=2, loader=3)


def test_use_sets_torchs_thread_count(four_cpus):
    import torch

    before = torch.get_num_threads()
    try:
        assert cpus.use(3).torch == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_cpus_without_affinity_counts_the_machine(monkeypatch):
    """Off Linux (no sched_getaffinity): os.cpu_count(), or 1 where even that is unknown."""
    from pipeline.runtime import cpus

    monkeypatch.delattr(cpus.os, "sched_getaffinity")
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 3)
    assert cpus.available() == 3
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: None)
    assert cpus.available() == 1
