"""Every cell's metrics -> paper-style tables (Markdown, CSV, LaTeX/booktabs) and figures.

Reads whatever exists under ``<results>/cells/*`` (a cell not computed yet is "—", a diverged
one "fail", replicate seeds mean ± std), so it works without Snakemake and after a partial run:

    python -m pipeline.tables results/
    python -m pipeline.tables results-tiny --config workflow/config/config.yaml \\
        --config workflow/config/presets/tiny.yaml      # also list the cells the grid expects

Writes ``<results>/tables/{main.md,all.md,cells.csv}``, ``<study>.{md,csv,tex}`` for each study
(pipeline.studies) and ``<results>/figures/*.{png,pdf}`` (pipeline.figures); prints the main table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import Counter
from pathlib import Path

from pipeline.config import ConfigError, load_yaml, merge
from pipeline.grid import grid_cells
from pipeline.io import atomic_write_text
from pipeline.layout import TABLE_FORMATS
from pipeline.studies import Table, Value, collect, studies

MISSING = "—"
FAIL = "fail"
PARTIAL = "‡"
FOOTNOTES = {
    MISSING: f"{MISSING}: not computed (the cell is not in the grid, or its jobs have not run or failed).",
    FAIL: f"{FAIL}: pretraining failed: its loss diverged (non-finite) or sat at chance, ln(number of logits), "
    "where no positive stands out from its negatives.",
    "±": "mean ± std (sample standard deviation) over the seeds of a cell (cells differing only in seed); "
    "detection columns: over every fine-tuning trial of those seeds (detect.trials).",
    PARTIAL: f"{PARTIAL}: some seeds diverged; they are excluded from the mean.",
}


# --- formatting ------------------------------------------------------------------------------
def fmt(v: Value, typical_n: int | None = None, decimals: int = 1) -> str:
    """'mean ± std', marked when seeds diverged, and '(n=k)' when k is not the table's usual n."""
    if v.status == "missing":
        return MISSING
    if v.status == "fail":
        return FAIL
    text = f"{v.mean:.{decimals}f}" + (f" ± {v.std:.{decimals}f}" if v.std is not None else "")
    return text + (PARTIAL if v.failed else "") + (f" (n={v.n})" if typical_n and v.n != typical_n else "")


def formatted(row, typical_n: int | None, table: Table) -> list[str]:
    return [fmt(v, typical_n, d) for v, d in zip(row.values, table.decimals())]


def typical_runs(table: Table) -> int | None:
    """The most common number of runs behind a number of the table (the smaller on a tie)."""
    counts = Counter(v.n for r in table.rows for v in r.values if v.n)
    return min(counts, key=lambda n: (-counts[n], n)) if counts else None


def runs_note(table: Table) -> str | None:
    """How many runs stand behind the numbers: seeds of a cell (for AP, seeds x fine-tuning trials)."""
    n = typical_runs(table)
    if n is None:
        return None
    what = "(pretraining seeds; for AP, seeds × detection trials)"
    if any(v.n and v.n != n for r in table.rows for v in r.values):
        return f"n = {n} runs {what} behind every number not marked (n=k)"
    if n == 1:
        return "n = 1: every number comes from a single run (one seed); grid.seeds adds replicates"
    return f"n = {n}: every number comes from {n} runs {what}"


def footnotes(table: Table) -> list[str]:
    texts = [fmt(v) for r in table.rows for v in r.values]
    notes = [note for mark, note in FOOTNOTES.items() if any(mark in t for t in texts)]
    return notes + [n for n in [runs_note(table)] if n] + table.notes


def markdown(table: Table) -> str:
    header = table.keys + table.columns
    lines = [
        f"### {table.title}",
        "",
        f"_{table.provenance}_",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(table.keys) + "---:|" * len(table.columns),
    ]
    n = typical_runs(table)
    lines += ["| " + " | ".join(r.keys + formatted(r, n, table)) + " |" for r in table.rows]
    notes = footnotes(table)
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def row_status(values: list[Value]) -> str:
    if not values:
        return ""  # a row of text only (the claims table)
    states = {v.status for v in values}
    return states.pop() if len(states) == 1 else "partial"


def to_csv(table: Table) -> str:
    """Same rows as the paper layout; per metric its mean, std and number of seeds (empty if none)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        table.keys + [f"{m}{s}" for m in table.metrics for s in ("", "_std", "_n")] + ["status", "cells", "provenance"]
    )
    for r in table.rows:
        nums = []
        for v in r.values:
            nums += ["" if v.mean is None else round(v.mean, 4), "" if v.std is None else round(v.std, 4), v.n]
        w.writerow(r.keys + nums + [row_status(r.values), ";".join(r.cells), table.provenance])
    return buf.getvalue()


# --- LaTeX (booktabs) ------------------------------------------------------------------------
TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    MISSING: "---",
    "±": r"$\pm$",
    PARTIAL: r"$^\ddagger$",
}
TEX_HEADERS = {
    "K": "$K$",
    "m": "$m$",
    "T": "$\\tau$",
    "AP50": "AP$_{50}$",
    "AP75": "AP$_{75}$",
    "APs": "AP$_S$",
    "APm": "AP$_M$",
    "APl": "AP$_L$",
}


def tex_escape(text: str) -> str:
    return "".join(TEX_ESCAPES.get(ch, ch) for ch in str(text))


def tex_header(text: str) -> str:
    return " ".join(TEX_HEADERS.get(word, tex_escape(word)) for word in text.split(" "))


def tex_headers(table: Table) -> list[str]:
    """Header rows: spanning group headers with \\cmidrule under them, then the column headers."""
    keys = [tex_header(h) for h in table.keys]
    if not table.groups or sum(len(g[1]) for g in table.groups) != len(table.columns):
        return [" & ".join(keys + [tex_header(h) for h in table.columns]) + r" \\"]
    spans, rules, col = [""] * len(keys), [], len(keys) + 1
    for label, shorts in table.groups:
        spans.append(rf"\multicolumn{{{len(shorts)}}}{{c}}{{{tex_escape(label)}}}")
        rules.append(rf"\cmidrule(lr){{{col}-{col + len(shorts) - 1}}}")
        col += len(shorts)
    shorts = [tex_header(s) for _, group in table.groups for s in group]
    return [" & ".join(spans) + r" \\", "".join(rules), " & ".join(keys + shorts) + r" \\"]


def latex(table: Table) -> str:
    """A booktabs table float (needs only \\usepackage{booktabs}); \\input it into a paper."""
    spec = "l" * len(table.keys) + "r" * len(table.columns)
    n = typical_runs(table)
    body = [" & ".join(tex_escape(c) for c in r.keys + formatted(r, n, table)) + r" \\" for r in table.rows]
    notes = [tex_escape(n) for n in footnotes(table)]
    lines = [
        "% generated by pipeline.tables (python -m pipeline.tables <results>); do not edit",
        r"\begin{table}[htbp]",
        r"\centering",
        r"\small",
        r"\setlength{\tabcolsep}{4pt}",
        rf"\caption{{{tex_escape(table.title)}. {{\footnotesize {tex_escape(table.provenance)}}}}}",
        rf"\label{{tab:{table.name.replace('_', '-')}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        *tex_headers(table),
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if notes:
        lines += [r"\par\smallskip", r"{\footnotesize " + r" \\ ".join(notes) + r"\par}"]
    return "\n".join(lines + [r"\end{table}"]) + "\n"


# --- writing ---------------------------------------------------------------------------------
def expected_cells(cfg: dict) -> dict[str, dict]:
    """The cells the grid declares (when the config has a grid), so missing ones get a row."""
    if not cfg.get("pretrain") or "grid" not in cfg:
        return {}
    return grid_cells(cfg)


def write_table(table: Table, folder: Path) -> None:
    """<folder>/<name>.{md,csv,tex}"""
    renderers = {"md": markdown, "csv": to_csv, "tex": latex}
    for ext in TABLE_FORMATS:
        atomic_write_text(renderers[ext](table), folder / f"{table.name}.{ext}")


def run(results: Path, cfg: dict | None = None, figures: bool = True) -> str:
    """Write every table (and figure); returns the main table (Markdown)."""
    cfg = cfg or {}
    df = collect(results, expected_cells(cfg))
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(df.drop(columns=["params"]).to_csv(index=False), out / "cells.csv")
    tables = studies(df, cfg, results)
    for t in tables:
        write_table(t, out)
    main = markdown(tables[0])
    if df.empty:
        main = f"No cell results under {results}/cells yet.\n\n" + main
    atomic_write_text(main, out / "main.md")
    atomic_write_text("\n".join(markdown(t) for t in tables), out / "all.md")
    if figures:
        from pipeline.figures import write_figures

        write_figures(df, results)
    return main


def load_configs(items: list[str]) -> dict:
    """--config values (YAML/JSON files or inline JSON), merged in order like --configfile."""
    cfg: dict = {}
    for item in items or []:
        cfg = merge(cfg, json.loads(item) if item.lstrip().startswith("{") else load_yaml(item))
    return cfg


def results_parser(description: str, config_help: str) -> argparse.ArgumentParser:
    """The command line of a table writer (tables, claims): a results folder and --config overlays."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="results", help="the results folder")
    ap.add_argument("--config", action="append", default=[], help=config_help)
    return ap


def results_folder(path: str, prog: str) -> Path:
    """The results folder of the command line; the program exits with a message if it is missing."""
    results = Path(path)
    if not results.is_dir():
        sys.exit(f"[{prog}] results folder not found: {results}")
    return results


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
