"""Per-stage wall time of a workflow run, from Snakemake's benchmark files.

    python -m pipeline.bench pipeline [--results results]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from pipeline.bench.timing import write


def collect(results: Path) -> pd.DataFrame:
    rows = []
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(results / "benchmarks")
        stage = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        job = "/".join(rel.with_suffix("").parts[1:])  # e.g. base, or base/trial0 (detection)
        frame = pd.read_csv(tsv, sep="\t")
        rows.append({"stage": stage, "job": job, "seconds": float(frame["s"].iloc[-1]),
                     "max_rss_mb": float(pd.to_numeric(frame["max_rss"], errors="coerce").iloc[-1])})
    return pd.DataFrame(rows)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results")
    args = ap.parse_args(argv)
    jobs = collect(Path(args.results))
    if jobs.empty:
        raise SystemExit(f"no Snakemake benchmark files under {args.results}/benchmarks: run the workflow first")
    per_stage = (jobs.groupby("stage")
                 .agg(jobs=("seconds", "size"), total_s=("seconds", "sum"), mean_s=("seconds", "mean"),
                      max_s=("seconds", "max"), max_rss_mb=("max_rss_mb", "max"))
                 .sort_values("total_s", ascending=False).round(1))
    total = float(jobs["seconds"].sum())
    per_stage["share_%"] = (100 * per_stage["total_s"] / total).round(1)
    print(per_stage.to_markdown())
    print(f"\nsum of job wall times: {total:.0f} s over {len(jobs)} jobs")
    result = {"results": args.results, "sum_job_seconds": round(total, 1),
              "stages": per_stage.reset_index().to_dict(orient="records"),
              "jobs": jobs.round(2).to_dict(orient="records")}
    write("pipeline", result)
    return result


if __name__ == "__main__":
    main()
