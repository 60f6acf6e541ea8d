"""Per-stage wall time of a workflow run, from Snakemake's benchmark files, and where each
job's time went (the ``timing`` its stage wrote: setup = imports, model and loader
construction; loader_first_batch = FFCV's compilation; steps; data_wait; knn_monitor;
checkpoints; features / fit for probes; fine_tune / evaluate for detection).

    python -m pipeline.bench pipeline [--results results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from pipeline.bench.timing import cpu, write

# where each stage's job writes its timing, relative to the results folder (detection: see _timing_path)
TIMING_FILES = {"pretrain": "cells/{job}/pretrain/summary.json", "probe": "cells/{job}/probe.json"}


def collect(results: Path) -> pd.DataFrame:
    rows = []
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(results / "benchmarks")
        stage = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        job = "/".join(rel.with_suffix("").parts[1:])  # e.g. base, or base/trial0 (detection)
        frame = pd.read_csv(tsv, sep="\t")
        rows.append(
            {
                "stage": stage,
                "job": job,
                "seconds": float(frame["s"].iloc[-1]),
                "max_rss_mb": float(pd.to_numeric(frame["max_rss"], errors="coerce").iloc[-1]),
            }
        )
    return pd.DataFrame(rows)


def _timing_path(results: Path, stage: str, job: str) -> Path | None:
    if stage == "detect":  # benchmark detect/<cell>/<trial>.tsv -> cells/<cell>/detect/<trial>.json
        cell, _, trial = job.rpartition("/")
        return results / "cells" / cell / "detect" / f"{trial}.json" if cell else None
    return results / TIMING_FILES[stage].format(job=job) if stage in TIMING_FILES else None


def attribution(results: Path, jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per job that recorded its timing: seconds per phase, and ``outside`` = the
    job's wall time (Snakemake's) minus the process's own (interpreter start, Snakemake)."""
    rows = []
    for job in jobs.itertuples():
        path = _timing_path(results, job.stage, job.job)
        try:
            timing = json.loads(path.read_text()).get("timing") if path else None
        except (OSError, ValueError):
            timing = None
        if timing:
            rows.append(
                {
                    "stage": job.stage,
                    "job": job.job,
                    "job_s": job.seconds,
                    **timing,
                    "outside": round(job.seconds - timing["wall"], 2),
                }
            )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    last = ["other", "wall", "outside"]
    return frame[[c for c in frame.columns if c not in last] + last]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results")
    args = ap.parse_args(argv)
    jobs = collect(Path(args.results))
    if jobs.empty:
        raise SystemExit(f"no Snakemake benchmark files under {args.results}/benchmarks: run the workflow first")
    per_stage = (
        jobs.groupby("stage")
        .agg(
            jobs=("seconds", "size"),
            total_s=("seconds", "sum"),
            mean_s=("seconds", "mean"),
            max_s=("seconds", "max"),
            max_rss_mb=("max_rss_mb", "max"),
        )
        .sort_values("total_s", ascending=False)
        .round(1)
    )
    total = float(jobs["seconds"].sum())
    per_stage["share_%"] = (100 * per_stage["total_s"] / total).round(1)
    print(per_stage.to_markdown())
    print(f"\nsum of job wall times: {total:.0f} s over {len(jobs)} jobs")
    phases = attribution(Path(args.results), jobs)
    if not phases.empty:
        print("\nwhere each job's time went (s):")
        print(phases.fillna("").to_markdown(index=False))
    c = cpu()
    print(f"\nCPU: {c['model']} ({', '.join(c['vector_flags']) or 'no AVX'})")
    result = {
        "results": args.results,
        "sum_job_seconds": round(total, 1),
        "stages": per_stage.reset_index().to_dict(orient="records"),
        "jobs": jobs.round(2).to_dict(orient="records"),
        "attribution": phases.to_dict(orient="records"),
    }
    write("pipeline", result)
    return result


if __name__ == "__main__":
    main()
