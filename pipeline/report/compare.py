"""Two results folders of the same grid, cell group by cell group, paired by seed.

    python -m pipeline.report.compare RESULTS_A RESULTS_B [--metric top1 ...] [--margin 5]
        [--protocol-a NAME] [--protocol-b NAME]

For each seed-less group that both folders ran (base, method=supervised, ...) and each metric:
B − A on every seed both have, its mean with the 95 % CI, and whether its 90 % CI lies inside
±margin (two one-sided tests: "the same within the margin"), as the claims' equivalence rows
judge. Whether a table's directions moved is read from the two folders' own tables.

What it is for: the same grid run two ways, the same seeds; e.g. fp32 against the fast path
(pretrain.fast_path: on: the evidence ``auto`` needs before it may turn it on for a CPU,
docs/performance.md), one CPU against another, or one commit against another; or one folder's
checkpoints fine-tuned two ways (``--protocol-b bf16``: B's detection metrics from detect.protocols'
``bf16`` entry, ``detect-bf16.json``, A's from detect's own). Failed seeds are left out of the
pairing and counted, and so are seeds with the metric on one side only (e.g. a fine-tuning that
diverged: it writes no metrics). Writes nothing; prints a Markdown table.
"""

from __future__ import annotations

import argparse

import pandas as pd

from pipeline.report import stats
from pipeline.report.studies import collect, seed_of
from pipeline.report.writers import results_folder

DEFAULT_METRICS = ("top1", "knn_top1")
DEFAULT_MARGIN = stats.EQUIVALENCE_MARGIN


def by_seed(df: pd.DataFrame, group: str, metric: str) -> tuple[dict[int, float], int]:
    """The group's value per seed (runs that did not fail and have the metric), and its failed seeds."""
    rows = df[df["group"] == group]
    ok = rows[(rows["status"] != "fail") & rows[metric].notna()]
    return {seed_of(r): float(r[metric]) for _, r in ok.iterrows()}, int((rows["status"] == "fail").sum())


def compare(a: pd.DataFrame, b: pd.DataFrame, metrics=DEFAULT_METRICS, margin: float = DEFAULT_MARGIN) -> list[dict]:
    """One row per group both ran and metric: the paired Δ (B − A) and the equivalence verdict."""
    rows = []
    for group in sorted(set(a["group"]) & set(b["group"])):
        for metric in metrics:
            (va, fa), (vb, fb) = by_seed(a, group, metric), by_seed(b, group, metric)
            delta = stats.paired(vb, va)
            if delta is None:
                continue
            one_side = len(va.keys() ^ vb.keys())
            interval = stats.equivalence_interval(delta)
            verdict, _ = stats.equivalent(delta, margin)
            rows.append(
                {
                    "group": group,
                    "metric": metric,
                    "A": round(sum(va[s] for s in va.keys() & vb.keys()) / delta.n, 1),
                    "B": round(sum(vb[s] for s in va.keys() & vb.keys()) / delta.n, 1),
                    "delta": delta.text(signed=True),
                    "ci90": None if interval is None else f"[{interval[0]:+.1f}, {interval[1]:+.1f}]",
                    "within_margin": verdict,
                    "failed": fa + fb,
                    "one_side": one_side,
                }
            )
    return rows


def to_markdown(rows: list[dict], a: str, b: str, margin: float) -> str:
    head = (
        f"B − A, paired by seed (A: {a}, B: {b}); within ±{margin:g}: holds when the 90 % CI lies inside it\n\n"
        "| group | metric | A | B | Δ B − A (95 % CI) | 90 % CI | within ±margin | failed seeds | "
        "seeds with a value on one side |\n"
        "|---|---|---:|---:|---:|---:|---|---:|---:|\n"
    )
    lines = [
        f"| {r['group']} | {r['metric']} | {r['A']} | {r['B']} | {r['delta']} | {r['ci90'] or '—'} | "
        f"{r['within_margin']} | {r['failed']} | {r['one_side']} |"
        for r in rows
    ]
    return head + "\n".join(lines) if lines else "No cell group has a seed in both folders."


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="results folder A (the reference)")
    ap.add_argument("b", help="results folder B")
    ap.add_argument("--metric", nargs="+", default=list(DEFAULT_METRICS), help="columns of the tables' cells")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    for side in ("a", "b"):
        ap.add_argument(
            f"--protocol-{side}",
            metavar="NAME",
            help=f"{side.upper()}'s detection metrics from this detect.protocols entry (default: detect's own)",
        )
    args = ap.parse_args(argv)
    a, b = results_folder(args.a, "compare"), results_folder(args.b, "compare")
    df_a, df_b = collect(a, protocol=args.protocol_a), collect(b, protocol=args.protocol_b)
    unknown = [m for m in args.metric if m not in df_a.columns or m not in df_b.columns]
    if unknown:
        raise SystemExit(f"[compare] no column {unknown} in the cells (e.g. {', '.join(DEFAULT_METRICS)}, AP50)")
    rows = compare(df_a, df_b, args.metric, args.margin)
    sides = ((a, args.protocol_a), (b, args.protocol_b))
    label_a, label_b = (f"{folder} (detection: {p})" if p else str(folder) for folder, p in sides)
    print(to_markdown(rows, label_a, label_b, args.margin))
    return rows


if __name__ == "__main__":
    main()
