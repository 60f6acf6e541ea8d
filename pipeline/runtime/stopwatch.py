"""Where a job's wall time went: seconds per named phase, from the process's start.

Each stage keeps one Stopwatch and writes ``report()`` into its summary (``"timing"``);
``python -m pipeline.bench pipeline`` sets the phases beside Snakemake's wall time of the job.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from contextlib import contextmanager


def process_age() -> float:
    """Seconds since this process started (imports included), from /proc; 0 elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class Stopwatch:
    def __init__(self):
        self.origin = time.perf_counter() - process_age()
        self.phases: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - t0

    def mark(self, name: str) -> None:
        """Everything since the process started that no phase has claimed yet goes to ``name``
        (e.g. "setup": imports, model and loader construction)."""
        self.phases[name] += self.elapsed() - sum(self.phases.values())

    def elapsed(self) -> float:
        return time.perf_counter() - self.origin

    def report(self) -> dict:
        """{phase: seconds, ..., "other": unclaimed, "wall": since the process started}."""
        wall = self.elapsed()
        out = {name: round(s, 2) for name, s in self.phases.items()}
        out["other"] = round(max(0.0, wall - sum(self.phases.values())), 2)
        out["wall"] = round(wall, 2)
        return out
