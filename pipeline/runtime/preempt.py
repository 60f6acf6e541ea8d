"""Preemption and time limits: on SLURM's warning signal, save and requeue.

SLURM sends a signal before it kills a job at its time limit or on preemption (e.g.
``--signal=USR1@180``; submitit uses USR2). The handler only sets a flag; the training loop
checks it after each step, writes its resume state, and then, for USR1/USR2 under SLURM, the
job is requeued (``scontrol requeue``); otherwise (SIGTERM, i.e. scancel, or outside SLURM)
it exits with status 75 (EX_TEMPFAIL). The restarted run resumes from the state it wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
EXIT_REQUEUE = 75
SYNC_STEPS = 10  # ranks agree on a stop every this many steps (stop_agreed)
_requested: list[int] = []


def _handler(signum, frame) -> None:
    _requested.append(signum)


def install() -> None:
    """Catch the warning signals (main thread only; a no-op elsewhere)."""
    try:
        for sig in SIGNALS:
            signal.signal(sig, _handler)
    except ValueError:
        return
    if not _fork_hook:
        os.register_at_fork(before=_block_signals, after_in_parent=_restore_mask, after_in_child=_uninstall_in_child)
        _fork_hook.append(True)


_fork_hook: list[bool] = []  # registered once per process
_mask_before_fork: list[set] = []  # the forking thread's signal mask, restored after the fork


def _block_signals() -> None:
    """Before a fork: hold the warning signals pending, so that one sent to the new child before
    it resets its handlers (a pool's terminate() right after the pool forked) is not caught by
    the inherited flag-setting handler and lost, but delivered once the child can die of it."""
    _mask_before_fork.append(signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS))


def _restore_mask() -> None:
    if _mask_before_fork:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork.pop())


def _uninstall_in_child() -> None:
    """A process forked from this one (a loader worker, a pool or writer process) dies on SIGTERM
    as usual: with the flag-setting handler it would outlive its parent's terminate() and the
    join after it (a pool's workers wait on a lock the terminating parent holds). The default
    actions first, then the mask of before the fork: a signal held pending since is delivered."""
    for sig in SIGNALS:
        if signal.getsignal(sig) is _handler:
            signal.signal(sig, signal.SIG_DFL)
    _restore_mask()


def requested() -> bool:
    return bool(_requested)


def stop_agreed(step: int, world_size: int) -> bool:
    """A preemption signal reached any rank: all ranks stop at the same step.

    Ranks agree through a one-element all-reduce, every SYNC_STEPS steps only, so that the
    check costs no host-device sync on the other steps.
    """
    if world_size == 1:
        return requested()
    if step % SYNC_STEPS:
        return False
    import torch  # here: the DAG build imports this package without torch

    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    flag = torch.tensor(float(requested()), device=device)
    torch.distributed.all_reduce(flag)
    return bool(flag > 0)


def received() -> list[int]:
    """The signals caught so far, in order."""
    return list(_requested)


def requeue_and_exit(log) -> None:
    """After the state is saved: requeue this SLURM job (rank 0 only), then exit."""
    signame = signal.Signals(_requested[0]).name
    job = os.environ.get("SLURM_JOB_ID")
    rank0 = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"
    # SIGTERM is also what scancel sends: a cancelled job must stay cancelled, not come back.
    warned = _requested[0] in (signal.SIGUSR1, signal.SIGUSR2)
    if job and rank0 and warned and os.environ.get("MOCO_REQUEUE", "1") == "1":
        log(f"{signame} received: state saved, requeueing SLURM job {job}")
        subprocess.run(["scontrol", "requeue", job], check=False)
    else:
        log(f"{signame} received: state saved, exiting with {EXIT_REQUEUE} (restart to resume)")
    sys.stdout.flush()
    sys.exit(EXIT_REQUEUE)
