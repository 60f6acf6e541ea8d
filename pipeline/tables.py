"""Aggregate every cell's metrics into paper-style tables (Markdown and CSV).

Reads whatever exists under ``<results>/cells/*`` (a missing metric is shown as "—" with a
footnote), so it works without Snakemake and after a partial run:

    python -m pipeline.tables results/
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from pipeline.grid import AXES, BASE_ID, parse_cell_id
from pipeline.io import atomic_write_text

MISSING = "—"
METRICS = {"probe_top1": "linear top-1", "probe_top5": "linear top-5", "knn_top1": "kNN top-1",
           "AP50": "AP50", "AP": "AP", "AP75": "AP75"}
FOOTNOTE = f"{MISSING}: not computed yet (the cell's job has not run or failed)."


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def collect(results: Path) -> pd.DataFrame:
    """One row per cell directory: its parameters and every metric found."""
    rows = []
    for cell_dir in sorted((results / "cells").glob("*")):
        if not cell_dir.is_dir():
            continue
        cfg = _read(cell_dir / "pretrain" / "config.json") or {}
        params = cfg.get("pretrain") or parse_cell_id(cell_dir.name)
        row = {"cell": cell_dir.name, **{a: params.get(a) for a in AXES}}
        summary = _read(cell_dir / "pretrain" / "summary.json") or {}
        final = summary.get("final") or {}
        row.update(diverged=bool(summary.get("diverged", False)), pretrain_loss=final.get("loss"),
                   inst_acc=final.get("inst_acc"))
        probe = _read(cell_dir / "probe.json") or {}
        row.update(probe_top1=probe.get("top1"), probe_top5=probe.get("top5"), knn_top1=probe.get("knn_top1"),
                   probe_mode=probe.get("mode"))
        det = _read(cell_dir / "detect.json") or {}
        row.update({k: det.get(k) for k in ("AP50", "AP", "AP75")})
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(value, diverged: bool = False) -> str:
    if diverged:
        return "fail"
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return MISSING
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def markdown(df: pd.DataFrame, first: str, title: str, note: str) -> str:
    cols = [first] + [c for c in METRICS if c in df.columns]
    lines = [f"### {title}", "", f"_{note}_", "",
             "| " + " | ".join([first] + [METRICS[c] for c in cols[1:]]) + " |",
             "|" + "---|" * len(cols)]
    missing = False
    for _, r in df.iterrows():
        cells = [_fmt(r[first])] + [_fmt(r[c], bool(r.get("diverged")) and c.startswith(("probe", "knn"))) for c in cols[1:]]
        missing |= MISSING in cells
        lines.append("| " + " | ".join(cells) + " |")
    if missing:
        lines += ["", FOOTNOTE]
    return "\n".join(lines) + "\n"


def ablation(df: pd.DataFrame, axis: str) -> pd.DataFrame:
    """The base cell and the cells that differ from it in ``axis`` only, sorted by it."""
    def only(cell: str) -> bool:
        diff = parse_cell_id(cell)
        return cell == BASE_ID or (set(diff) == {axis})
    sub = df[df["cell"].map(only) & (df["method"] == "moco")]
    return sub.sort_values(axis) if len(sub) > 1 else sub.iloc[0:0]


def provenance(df: pd.DataFrame) -> str:
    base = df[df["cell"] == BASE_ID]
    if base.empty:
        return "base cell missing"
    b = base.iloc[0]
    return (f"MoCo {b['variant']}, {b['backbone']} (width {b['width']}), {b['epochs']} epochs, "
            f"batch {b['batch_size']}, K={b['K']}, m={b['m']}, T={b['T']}; linear probe "
            f"({df['probe_mode'].dropna().iloc[0] if df['probe_mode'].notna().any() else '?'}); "
            f"other parameters as the base cell")


def method_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for name, sel in (("MoCo (base cell)", df["cell"] == BASE_ID),
                      ("supervised", df["cell"] == "method=supervised"),
                      ("random init", df["cell"] == "method=random")):
        if sel.any():
            rows.append({"method": name, **df[sel].iloc[0].to_dict()})
    return pd.DataFrame(rows)


def write_tables(results: Path, dataset: str = "embedded synthetic shapes") -> str:
    df = collect(results)
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(df.to_csv(index=False), out / "cells.csv")
    if df.empty:
        text = f"No cell results under {results}/cells yet.\n"
        atomic_write_text(text, out / "main.md")
        return text
    note = f"dataset: {dataset}; {provenance(df)}"
    main = markdown(method_table(df), "method", "MoCo vs supervised vs random init", note)
    parts = [main]
    for axis in AXES:
        if axis in ("method",):
            continue
        sub = ablation(df, axis)
        if len(sub) > 1:
            text = markdown(sub, axis, f"Ablation over {axis}", note)
            atomic_write_text(text, out / f"ablation_{axis}.md")
            atomic_write_text(sub.to_csv(index=False), out / f"ablation_{axis}.csv")
            parts.append(text)
    atomic_write_text(main, out / "main.md")
    atomic_write_text("\n".join(parts), out / "all.md")
    return "\n".join(parts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="results", help="the results folder")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not results.is_dir():
        sys.exit(f"[tables] results folder not found: {results}")
    print(write_tables(results))


if __name__ == "__main__":
    main()
