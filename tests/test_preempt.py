"""The preemption handler (pipeline/runtime/preempt.py) and the processes a stage forks: a
forked child dies of SIGTERM as usual, even one that gets it before it could reset the handler
it inherited (a pool's terminate() right after the pool forked: issue 47's hung suite)."""

import subprocess
import sys
import textwrap

from conftest import REPO

RACE = textwrap.dedent(
    """
    import multiprocessing as mp, os, signal
    # the race made certain: SIGTERM reaches the child before preempt's own after-fork hook runs
    os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
    from pipeline.runtime import preempt
    preempt.install()
    child = mp.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join(60)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print(child.exitcode, signal.getsignal(signal.SIGTERM) is preempt._handler, len(blocked))
    """
)


def test_a_child_signalled_before_it_resets_its_handlers_dies_of_it():
    """Without the signals held across the fork the child's inherited handler caught the SIGTERM
    and it lived on (exit code 0), and a pool's join waited for ever."""
    out = subprocess.run([sys.executable, "-c", RACE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # killed by SIGTERM; the parent keeps its handler and its signal mask
    assert out.stdout.split() == ["-15", "True", "0"]


def test_install_outside_the_main_thread_is_a_no_op():
    """signal.signal raises ValueError off the main thread: install leaves the handlers as they were."""
    import signal
    import threading

    from pipeline.runtime import preempt

    before = {sig: signal.getsignal(sig) for sig in preempt.SIGNALS}
    thread = threading.Thread(target=preempt.install)
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in preempt.SIGNALS} == before
