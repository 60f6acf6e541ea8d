"""Every cell's metrics -> paper-style tables (Markdown, CSV, LaTeX/booktabs) and figures.

Reads whatever exists under ``<results>/cells/*`` (a cell not computed yet is "—", a failed one
"fail", replicate seeds mean ± 95 % CI with n, each row's Δ against its table's reference paired
by seed), so it works without Snakemake and after a partial run:

    python -m pipeline.tables results/
    python -m pipeline.tables results-tiny --config workflow/config/config.yaml \\
        --config workflow/config/presets/tiny.yaml      # also list the cells the grid expects

Writes ``<results>/tables/{main.md,all.md,cells.csv}``, ``<study>.{md,csv,tex}`` for each study
(pipeline.report.studies, written by pipeline.report.writers) and ``<results>/figures/*.{png,pdf}``
(pipeline.report.figures); prints the main table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.dag.config import ConfigError, load_config
from pipeline.dag.grid import grid_cells
from pipeline.report.studies import collect, studies
from pipeline.report.writers import load_configs, markdown, results_folder, results_parser, write_table
from pipeline.runtime.io import atomic_write_text


def expected_cells(cfg: dict) -> dict[str, dict]:
    """The cells the grid declares (when the config has a grid), so missing ones get a row:
    each as the config states it, as a finished cell's config.json holds it."""
    if not cfg.get("pretrain") or "grid" not in cfg:
        return {}
    return {cid: cell.stated(cfg["pretrain"]) for cid, cell in grid_cells(load_config(cfg)).items()}


def run(results: Path, cfg: dict | None = None, figures: bool = True) -> str:
    """Write every table (and figure); returns the main table (Markdown)."""
    cfg = cfg or {}
    df = collect(results, expected_cells(cfg))
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    # raw per-cell numbers (where each ran: the tables' footnotes and each cell's summary.json)
    atomic_write_text(df.drop(columns=["params", "provenance"], errors="ignore").to_csv(index=False), out / "cells.csv")
    tables = studies(df, cfg, results)
    for t in tables:
        write_table(t, out)
    main = markdown(tables[0])
    if df.empty:
        main = f"No cell results under {results}/cells yet.\n\n" + main
    atomic_write_text(main, out / "main.md")
    atomic_write_text("\n".join(markdown(t) for t in tables), out / "all.md")
    if figures:
        from pipeline.report.figures import write_figures

        write_figures(df, results)
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
