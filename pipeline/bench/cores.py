"""How to spend a machine's cores on pretraining jobs: one job with every core as torch
threads, or several single-thread jobs at once (Snakemake's ``threads`` per rule, ``--cores``).

    python -m pipeline.bench cores [--configfile preset.yaml ...] [--data results/data/ffcv]
                                   [--cores N] [--epochs 2] [--rounds 2]

Each layout runs real epochs of the base cell (loader -> recipe -> step) in separate
processes started together; after one warm-up epoch each process times its epochs. The
layouts alternate round after round; the result is the machine's total training throughput
(steps per second, summed over the jobs) per layout, and its ratio to one job using all cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.bench.timing import cpu, write


def worker(configfiles: list[str], data: Path, threads: int, epochs: int) -> dict:
    from pipeline.bench.epoch import base_cell_config
    from pipeline.pretrain import Job, Trainer
    from pipeline.runtime import distributed

    cfg = base_cell_config(configfiles)
    cfg["pretrain"]["threads"] = threads  # the Trainer splits it (pipeline.runtime.cpus)
    with tempfile.TemporaryDirectory() as state:
        trainer = Trainer(Job.of(cfg), data, Path(state), distributed.init(), progress=False)
        trainer.run_epoch(0)  # warm-up: compilation, allocator
        t0 = time.perf_counter()
        for _ in range(epochs):
            trainer.step_in_epoch = 0
            trainer.run_epoch(0)
        seconds = time.perf_counter() - t0
    return {"threads": threads, "steps": epochs * len(trainer.loader), "seconds": seconds}


def run_layout(configfiles: list[str], data: Path, jobs: int, threads: int, epochs: int) -> float:
    """Total steps per second of ``jobs`` processes of ``threads`` threads each, run together."""
    cmd = [
        sys.executable,
        "-m",
        "pipeline.bench",
        "cores",
        "--worker",
        "--data",
        str(data),
        "--threads",
        str(threads),
        "--epochs",
        str(epochs),
        "--configfile",
        *configfiles,
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(jobs)]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("[bench] a worker failed: rerun one with --worker to see why")
    return sum(o["steps"] / o["seconds"] for o in outs)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", nargs="*", default=[], help="YAML files over the workflow's config")
    ap.add_argument("--data", default="results/data/ffcv")
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    data = Path(args.data)
    if args.worker:
        print(json.dumps(worker(args.configfile, data, args.threads, args.epochs)))
        return {}
    if not (data / "train.beton").is_file():
        raise SystemExit(f"[bench] {data / 'train.beton'} not found: convert the dataset first")
    layouts = {
        f"{args.cores // t} job(s) x {t} thread(s)": (args.cores // t, t)
        for t in sorted({args.cores, 1, max(1, args.cores // 2)}, reverse=True)
    }
    rates: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(args.rounds):
        for name, (jobs, threads) in layouts.items():
            rates[name].append(run_layout(args.configfile, data, jobs, threads, args.epochs))
    one_job = statistics.median(rates[next(iter(layouts))])
    result = {
        "cores": args.cores,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "layouts": {
            name: {
                "jobs": layouts[name][0],
                "threads": layouts[name][1],
                "steps_per_s": round(statistics.median(r), 3),
                "all_s": [round(x, 3) for x in r],
                "ratio_vs_one_job": round(statistics.median(r) / one_job, 3),
            }
            for name, r in rates.items()
        },
    }
    path = write("cores", result)
    c = cpu()
    print(f"pretraining throughput on {args.cores} cores, {c['model']} ({'AVX-512' if c['avx512'] else 'no AVX-512'}):")
    for name, r in result["layouts"].items():
        print(f"  {name:<22} {r['steps_per_s']:.3f} steps/s  x{r['ratio_vs_one_job']:.3f}")
    print(f"({path})")
    return result


if __name__ == "__main__":
    main()
