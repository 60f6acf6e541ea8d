"""A pytest plugin that writes when each test ran and the CPU its process spent, per worker:
where a parallel suite's wall time and CPU went (docs/testing.md, "Measure it").

    PYTHONPATH=bench python -m pytest -p pytest_timeline -n auto ...
    # -> $TIMELINE_DIR (default bench/out/timeline)/<worker>.jsonl, one line per test start and end

Each line: the event, the test id, the time, and the worker's CPU seconds so far (user + system,
its own and its reaped children's: the stages a test runs as subprocesses count, processes
started by others, such as SLURM's, do not).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_sink = None


def _write(event: str, nodeid: str) -> None:
    global _sink
    if _sink is None:
        folder = Path(os.environ.get("TIMELINE_DIR", "bench/out/timeline"))
        folder.mkdir(parents=True, exist_ok=True)
        _sink = (folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl").open("a")
    t = os.times()
    cpu = t.user + t.system + t.children_user + t.children_system
    _sink.write(json.dumps({"ev": event, "id": nodeid, "t": time.time(), "cpu": cpu}) + "\n")
    _sink.flush()


def pytest_runtest_logstart(nodeid, location):
    _write("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _write("end", nodeid)
