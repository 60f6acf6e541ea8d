"""What a grid costs the SLURM side, and the workflow's expansion of a large grid.

- ``snakemake -n`` on a grid of ``--cells`` cells (seeds x K x m; expansion only, no cluster);
- from a recorded run (``--run <folder>``: ``sbatch.jsonl``, one ``{"t", "argv"}`` per sbatch
  call, as tests/site_profile.py's wrapper writes it, and ``controller.json``: slurmctld's CPU
  seconds and the run's wall seconds, as tests/test_slurm_grid.py writes it): jobs submitted
  per minute and the controller's CPU time per job.

    python -m pipeline.bench slurm [--cells 1000] [--run <folder>]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from pipeline.bench.dag import dry_run
from pipeline.bench.timing import interleaved, write
from pipeline.dag.config import REPO

# K x m of every grid; seeds make up the count (a paper grid's shape: seeds x K x m)
GRID_K = [256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
GRID_M = [0.0, 0.5, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999]


def grid_config(cells: int) -> dict:
    """A config whose grid has ``cells`` cells: len(GRID_K) x len(GRID_M) x seeds."""
    per_seed = len(GRID_K) * len(GRID_M)
    if cells < per_seed or cells % per_seed:
        raise ValueError(f"--cells must be a multiple of {per_seed} (K x m), got {cells}")
    return {
        "grid": {
            "seeds": cells // per_seed,
            "only": None,
            "one_at_a_time": {},
            "product": {"K": GRID_K, "m": GRID_M},
            "cells": [],
            "baselines": [],
        }
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/<pid>/stat fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jobs_in(argv: list[str]) -> int:
    """SLURM jobs one sbatch call makes: the tasks of --array=1-N (or a list), else 1."""
    for arg in argv:
        found = re.fullmatch(r"--array=([^%]+)(?:%\d+)?", arg)
        if found:
            count = 0
            for part in found[1].split(","):
                lo, _, hi = part.partition("-")
                count += int(hi) - int(lo) + 1 if hi else 1
            return count
    return 1


def submission_figures(calls: list[dict], controller_cpu_s: float, wall_s: float) -> dict:
    """Jobs and sbatch calls, jobs per minute over the run and at the busiest minute, the
    controller's CPU seconds in all and per job."""
    times = sorted(call["t"] for call in calls)
    jobs = sum(jobs_in(call["argv"]) for call in calls)
    busiest = max((sum(1 for u in times if t <= u < t + 60) for t in times), default=0)
    return {
        "sbatch_calls": len(calls),
        "jobs": jobs,
        "wall_s": round(wall_s, 1),
        "jobs_per_minute": round(jobs / (wall_s / 60), 1) if wall_s else None,
        "busiest_minute_calls": busiest,
        "controller_cpu_s": round(controller_cpu_s, 2),
        "controller_cpu_ms_per_job": round(1000 * controller_cpu_s / jobs, 1) if jobs else None,
    }


def recorded_run(folder: Path) -> dict:
    calls = [json.loads(line) for line in (folder / "sbatch.jsonl").read_text().splitlines() if line.strip()]
    controller = json.loads((folder / "controller.json").read_text())
    return submission_figures(calls, controller["cpu_s"], controller["wall_s"])


def expansion_seconds(cells: int, rounds: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    try:
        config = tmp / "grid.yaml"
        config.write_text(json.dumps(grid_config(cells)))
        run = dry_run(REPO, tmp / "r", ["--configfile", str(config)])
        return interleaved({f"snakemake -n, {cells} cells": run}, rounds=rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=1000, help="grid size for the expansion (multiple of 100)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run", type=Path, default=None, help="folder of a recorded grid run (see above)")
    args = ap.parse_args(argv)
    result: dict = {"expansion": expansion_seconds(args.cells, args.rounds)}
    for name, r in result["expansion"].items():
        print(f"{name}: median {r['median_s']:.2f} s of {args.rounds} (min {r['min_s']:.2f} s)")
    if args.run:
        result["run"] = recorded_run(args.run)
        print("recorded run: " + ", ".join(f"{k} {v}" for k, v in result["run"].items()))
    print(f"({write('slurm', result)})")
    return result


if __name__ == "__main__":
    main()
