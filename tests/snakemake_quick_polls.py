"""Snakemake with the SLURM executor plugin's status checks at most POLL_S apart: the command the
SLURM tests submit with (site_profile.snakemake_command()).

The plugin (2.8.0, ``Executor.check_active_jobs``) waits 10 s longer after each status check
that finds no job ended, up to 180 s; no setting changes the step or the cap. On a cluster of
hour-long jobs that spares the controller; on the test cluster, whose jobs take seconds, each
step of a chain (synthetic, convert, pretrain, probe, tables) waited for its job's end to be
seen. What the SLURM tests prove does not depend on when Snakemake sees a job end: the
submissions, the profile's lines, the requeues and the results are the same; only the waits
between a job's end and the next submission shorten.

    python tests/snakemake_quick_polls.py <snakemake arguments>

Coverage stops in this process as in tests/snakemake_untraced.py.
"""

from __future__ import annotations

import sys

from snakemake_untraced import stop_coverage

stop_coverage()  # as in every Snakemake run of the tests: snakemake_untraced.py says why

from snakemake.cli import main  # noqa: E402
from snakemake_executor_plugin_slurm import Executor  # noqa: E402

POLL_S = 3  # the test cluster's squeue answers in milliseconds

_interval = Executor.next_seconds_between_status_checks  # RemoteExecutor's property
if not isinstance(_interval, property):  # a plugin that changed how it schedules its checks
    raise RuntimeError("snakemake_executor_plugin_slurm.Executor.next_seconds_between_status_checks is not a property")
Executor.next_seconds_between_status_checks = property(
    _interval.fget, lambda executor, seconds: _interval.fset(executor, min(seconds, POLL_S))
)

if __name__ == "__main__":
    sys.exit(main())
