"""The preemption handlers belong to the training process: a process forked from it (a loader
worker, a pool or writer process) still dies on SIGTERM, so terminate() and join() end."""

import multiprocessing as mp
import signal
import subprocess

import pytest

from pipeline.runtime import preempt


@pytest.fixture
def installed():
    before = {sig: signal.getsignal(sig) for sig in preempt.SIGNALS}
    preempt.install()
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_the_handlers_catch_sigterm_in_the_training_process(installed):
    assert signal.getsignal(signal.SIGTERM) is preempt._handler


def _wait_for_ever(started, lock) -> None:
    started.set()
    lock.acquire()


def test_a_forked_process_blocked_on_a_lock_dies_on_terminate(installed):
    fork = mp.get_context("fork")
    lock, started = fork.Lock(), fork.Event()
    lock.acquire()  # as a pool's inqueue lock, held by the parent while it terminates the workers
    child = fork.Process(target=_wait_for_ever, args=(started, lock))
    child.start()
    try:
        assert started.wait(30)  # the child runs (its fork hooks are done)
        child.terminate()
        child.join(30)  # a bound, not a timing: SIGTERM's default action ends it at once
        assert child.exitcode == -signal.SIGTERM
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def _report_handlers(queue) -> None:
    queue.put({int(sig): signal.getsignal(sig) == signal.SIG_DFL for sig in preempt.SIGNALS})


def test_a_forked_process_has_the_default_handlers(installed):
    fork = mp.get_context("fork")
    queue = fork.SimpleQueue()
    child = fork.Process(target=_report_handlers, args=(queue,))
    child.start()
    defaults = queue.get()
    child.join()
    assert defaults == {int(sig): True for sig in preempt.SIGNALS} and child.exitcode == 0
    assert signal.getsignal(signal.SIGTERM) is preempt._handler  # the parent keeps its own


@pytest.mark.parametrize(
    "signum, env, requeued",
    [
        (signal.SIGUSR1, {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0"}, True),  # SLURM's warning, rank 0
        (signal.SIGUSR2, {"SLURM_JOB_ID": "42", "RANK": "1"}, False),  # the other ranks only exit
        (signal.SIGTERM, {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0"}, False),  # scancel: stays cancelled
        (signal.SIGUSR1, {}, False),  # outside SLURM
    ],
)
def test_requeue_after_a_warning_signal(monkeypatch, signum, env, requeued):
    for key in ("SLURM_JOB_ID", "SLURM_PROCID", "RANK", "MOCO_REQUEUE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    calls, logged = [], []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.setattr(preempt, "_requested", [signum])
    with pytest.raises(SystemExit) as stop:
        preempt.requeue_and_exit(logged.append)
    assert stop.value.code == 75
    assert calls == ([["scontrol", "requeue", "42"]] if requeued else [])
    name = signal.Signals(signum).name
    expected = "requeueing SLURM job 42" if requeued else "exiting with 75 (restart to resume)"
    assert logged == [f"{name} received: state saved, {expected}"]
