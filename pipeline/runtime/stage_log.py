"""A stage's log lines, ``[stage] message``: flushed at once, since users and tests follow the
stream live, and written through tqdm, which clears a progress bar and redraws it below the line
instead of tearing it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tqdm import tqdm


def is_main_process() -> bool:
    """Rank 0, or the one process (before init too: torchrun sets RANK): it logs and writes.
    (Here rather than in pipeline.runtime.distributed, so that a job that only logs, such as a
    cell's detection summary, never imports torch.)"""
    return os.environ.get("RANK", "0") == "0"


def stage_log(stage: str, *, stderr: bool = False, when: Callable[[], bool] = lambda: True) -> Callable[[str], None]:
    """The ``log(msg)`` function of a stage; ``when`` says whether this process logs (e.g. rank 0 only)."""

    def log(msg: str) -> None:
        if when():
            stream = sys.stderr if stderr else sys.stdout  # looked up per line: callers may redirect them
            tqdm.write(f"[{stage}] {msg}", file=stream)
            stream.flush()

    return log
