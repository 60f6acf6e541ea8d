"""Every cell's metrics -> paper-style tables (Markdown, CSV, LaTeX/booktabs) and figures.

Reads whatever exists under ``<results>/cells/*`` (a cell not computed yet is "—", a failed one
"fail", replicate seeds mean ± 95 % CI with n, each row's Δ against its table's reference paired
by seed), so it works without Snakemake and after a partial run:

    python -m pipeline.tables results/
    python -m pipeline.tables results-tiny --config workflow/config/config.yaml \\
        --config workflow/config/presets/tiny.yaml      # also list the cells the grid expects

Writes ``<results>/tables/{main.md,all.md,cells.csv}``, ``<study>.{md,csv,tex}`` for each study
the cells sweep (pipeline.report.studies, written by pipeline.report.writers; which ones:
pipeline.dag.sweeps) and ``<results>/figures/*.{png,pdf}`` (pipeline.report.figures); all.md
ends with the studies not swept and the command that runs each. Prints the main table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.base.layout import FIGURE_FORMATS, FIGURES, STUDY_NAMES, TABLE_FORMATS
from pipeline.dag import sweeps
from pipeline.dag.config import ConfigError, load_config
from pipeline.dag.grid import grid_cells
from pipeline.methods.section import Pretrain
from pipeline.report.studies import Table, collect, studies
from pipeline.report.writers import load_configs, markdown, results_folder, results_parser, write_table
from pipeline.runtime.io import atomic_write_text


def expected_cells(cfg: dict) -> dict[str, dict]:
    """The cells the grid declares (when the config has a grid), so missing ones get a row:
    each as the config states it, as a finished cell's config.json holds it."""
    if not cfg.get("pretrain") or "grid" not in cfg:
        return {}
    return {cid: cell.stated(cfg["pretrain"]) for cid, cell in grid_cells(load_config(cfg)).items()}


def fine_tuned(df, cfg: dict) -> str | None:
    """The detect.task of the transfer studies: segmentation where a cell's results hold mask AP,
    else the config's where it fine-tunes a cell of its grid, else detection where any holds box AP."""
    if "mask_AP50" in df and df["mask_AP50"].notna().any():
        return "segmentation"
    if cfg.get("pretrain") and "grid" in cfg and "detect" in cfg:
        loaded = load_config(cfg)
        task = sweeps.fine_tuned(loaded.detect, grid_cells(loaded))
        if task:
            return task
    return "detection" if "AP50" in df and df["AP50"].notna().any() else None


def not_swept_section(skipped: list[Table], cfg: dict) -> str:
    """all.md's last section: each study these cells do not sweep, with the command that adds it."""
    if not skipped:
        return ""
    base = load_config(cfg).pretrain if cfg.get("pretrain") else Pretrain()
    one_at_a_time = (cfg.get("grid") or {}).get("one_at_a_time")
    lines = [
        "### Studies these cells do not sweep",
        "",
        "Not written as tables or figures: each needs cells of its own.",
    ]
    lines += ["", "| study | command that runs its cells (the tables read every cell on disk) |", "|---|---|"]
    lines += [f"| {t.title} | `{sweeps.command(t.name, base, one_at_a_time)}` |" for t in skipped]
    return "\n".join(lines) + "\n"


def remove_stale(results: Path, tables: list[str], figures: list[str]) -> None:
    """An earlier run's table or figure of a study these cells no longer sweep."""
    stale = [results / "tables" / f"{n}.{ext}" for n in tables for ext in TABLE_FORMATS]
    stale += [results / "figures" / f"{n}.{ext}" for n in figures for ext in FIGURE_FORMATS]
    for path in stale:
        path.unlink(missing_ok=True)


def run(results: Path, cfg: dict | None = None, figures: bool = True) -> str:
    """Write every table (and figure) of the studies the cells sweep; returns the main table (Markdown)."""
    cfg = cfg or {}
    df = collect(results, expected_cells(cfg))
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    # raw per-cell numbers (where each ran: the tables' footnotes and each cell's summary.json)
    atomic_write_text(df.drop(columns=["params", "provenance"], errors="ignore").to_csv(index=False), out / "cells.csv")
    names = sweeps.swept([] if df.empty else df["cell"], fine_tuned(df, cfg))
    tables: list[Table] = []
    skipped: list[Table] = []
    for t in studies(df, cfg, results):  # the ablation_<axis> of other sweeps exist only where swept
        (tables if t.name in names or t.name not in STUDY_NAMES else skipped).append(t)
    for t in tables:
        write_table(t, out)
    main = markdown(tables[0])
    if df.empty:
        main = f"No cell results under {results}/cells yet.\n\n" + main
    atomic_write_text(main, out / "main.md")
    atomic_write_text("\n".join([*(markdown(t) for t in tables), not_swept_section(skipped, cfg)]), out / "all.md")
    shown = sweeps.drawn(names)
    remove_stale(results, [t.name for t in skipped], [f for f in FIGURES if f not in shown])
    if figures:
        from pipeline.report.figures import write_figures

        write_figures(df, results, shown)
    return main


def main(argv=None) -> None:
    ap = results_parser(
        __doc__,
        "workflow config (file or inline JSON; repeat to overlay): names the cells the "
        "grid expects and the dataset/protocol the tables state",
    )
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    args = ap.parse_args(argv)
    results = results_folder(args.results, "tables")
    try:
        text = run(results, load_configs(args.config), figures=not args.no_figures)
    except ConfigError as err:
        sys.exit(f"[tables] {err}")
    print(text)
    print(f"[tables] all tables: {results / 'tables'}/  figures: {results / 'figures'}/")


if __name__ == "__main__":
    main()
