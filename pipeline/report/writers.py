"""A study's table as text: Markdown, CSV and LaTeX (booktabs), with the values' uncertainty
(mean ± 95 % CI, n, failed seeds) and the footnotes that explain the marks; and the command line
that the table writers (pipeline.tables, pipeline.claims) share."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from pipeline.base.layout import TABLE_FORMATS
from pipeline.dag.config import load_yaml, merge
from pipeline.report.studies import METRIC_GROUPS, METRICS, Delta, Row, Table, Value
from pipeline.runtime.io import atomic_write_text

MISSING = "—"
FAIL = "fail"
FAILED = "failed)"  # the mark of a value some of whose seeds failed: "(n=2; 1 of 3 failed)"
NO_OUTPUT = "missing)"  # the mark of a value some of whose seeds have no output: "(n=2; 1 of 3 missing)"
REFERENCE = "reference"
FOOTNOTES = {
    MISSING: f"{MISSING}: not computed (the cell is not in the grid, or its jobs have not run or failed).",
    FAIL: f"{FAIL} (k of k): every seed's pretraining failed: its loss diverged (non-finite) or sat at the "
    "method's chance loss (every logit alike: no positive stands out from its negatives).",
    "(n=": "a ± b (n=k): the mean over k pretraining seeds (for AP, each seed's mean over its detection "
    "trials) ± the half-width of its 95 % confidence interval (Student t, k − 1 degrees of freedom); n=1: "
    "one seed, no interval (grid.seeds, claims.seeds add replicates).",
    FAILED: "k of n failed: k of the n seeds failed (diverged or collapsed); they are counted, not averaged.",
    NO_OUTPUT: "k of n missing: k of the n seeds have no output for this metric yet (not run, or it "
    "failed); they are counted, not averaged.",
}


# --- formatting ------------------------------------------------------------------------------
def fmt(v: Value, decimals: int = 1) -> str:
    """'mean ± CI half-width (n=k)', with 'j of m failed' / 'j of m missing' when seeds did."""
    if v.status == "missing":
        return MISSING
    if v.status == "fail":
        return f"{FAIL} ({v.failed} of {v.failed})"
    seeds = v.n + v.failed + v.missing
    extra = "".join(f"; {k} of {seeds} {what}" for k, what in ((v.failed, "failed"), (v.missing, "missing")) if k)
    assert v.estimate is not None  # status "ok": n > 0, so there is a mean
    return v.estimate.text(decimals, extra=extra)


def fmt_delta(row: Row, column: int = 0, decimals: int = 1) -> str:
    """A row's paired Δ of the table's Δ column ``column``: '+3.0 ± 1.2 (n=5)', with the pairs in
    which a run failed."""
    d: Delta | None = row.deltas[column]
    if row.reference[column]:
        return REFERENCE
    if d is None or (d.estimate is None and not d.failed):
        return MISSING
    failed = f"{d.failed} of {d.pairs} failed" if d.failed else ""
    if d.estimate is None:
        return f"{MISSING} ({failed})"
    return d.estimate.text(decimals, signed=True, extra=failed and f"; {failed}")


def headers(table: Table) -> list[str]:
    """The value columns' headers, the Δ columns' last."""
    return table.columns + [f"Δ {METRICS[metric]} vs {ref} (paired by seed)" for metric, ref in table.compared]


def formatted(row: Row, table: Table) -> list[str]:
    decimals = table.decimals()
    cells = [fmt(v, d) for v, d in zip(row.values, decimals)]
    for i, (metric, _) in enumerate(table.compared):
        cells.append(fmt_delta(row, i, decimals[table.metrics.index(metric)]))
    return cells


def delta_note(metric: str, ref: str) -> str:
    return (
        f"Δ vs {ref}: each row's {METRICS[metric]} minus {ref}'s, paired by seed "
        "(seed s − seed s), mean ± 95 % CI over the n pairs; a pair in which either run failed is "
        "counted as failed, not averaged."
    )


def footnotes(table: Table) -> list[str]:
    texts = [t for r in table.rows for t in formatted(r, table)]
    notes = [note for mark, note in FOOTNOTES.items() if any(mark in t for t in texts)]
    deltas = [delta_note(metric, ref) for metric, ref in table.compared]
    return notes + deltas + ([table.environment] if table.environment else []) + table.notes


def markdown(table: Table) -> str:
    header = table.keys + headers(table)
    lines = [
        f"### {table.title}",
        "",
        f"_{table.provenance}_",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(table.keys) + "---:|" * (len(header) - len(table.keys)),
    ]
    lines += ["| " + " | ".join(r.keys + formatted(r, table)) + " |" for r in table.rows]
    notes = footnotes(table)
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def row_status(values: list[Value]) -> str:
    if not values:
        return ""  # a row of text only (the claims table)
    states = {v.status for v in values}
    return states.pop() if len(states) == 1 else "partial"


def _num(x: float | None) -> str | float:
    return "" if x is None else round(x, 4)


def to_csv(table: Table) -> str:
    """Same rows as the paper layout; per metric its mean, std, 95 % CI half-width, number of
    seeds, of failed seeds and of seeds without output; then the paired Δ, its CI, pairs and failed pairs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    stats_of = ("", "_std", "_ci95", "_n", "_failed", "_missing")
    compared = [f"delta_{metric}{s}" for metric, _ in table.compared for s in ("", "_ci95", "_n", "_failed")]
    w.writerow(
        table.keys
        + [f"{m}{s}" for m in table.metrics for s in stats_of]
        + compared
        + ["status", "cells", "provenance", "environment"]
    )
    for r in table.rows:
        nums = []
        for v in r.values:
            nums += [_num(v.mean), _num(v.std), _num(v.half), v.n, v.failed, v.missing]
        for d in r.deltas:
            e = d.estimate if d else None
            nums += [_num(e.mean if e else None), _num(e.half if e else None), e.n if e else 0, d.failed if d else 0]
        w.writerow(r.keys + nums + [row_status(r.values), ";".join(r.cells), table.provenance, table.environment])
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
    "Δ": r"$\Delta$",
    "−": "-",
    "×": r"$\times$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≈": r"$\approx$",
    "→": r"$\to$",
    "‖": r"$\|$",
    "θ": r"$\theta$",
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
        return [" & ".join(keys + [tex_header(h) for h in headers(table)]) + r" \\"]
    groups = [*table.groups, *((f"Δ vs {ref}", [METRIC_GROUPS[metric][1]]) for metric, ref in table.compared)]
    spans, rules, col = [""] * len(keys), [], len(keys) + 1
    for label, shorts in groups:
        spans.append(rf"\multicolumn{{{len(shorts)}}}{{c}}{{{tex_escape(label)}}}")
        rules.append(rf"\cmidrule(lr){{{col}-{col + len(shorts) - 1}}}")
        col += len(shorts)
    shorts = [tex_header(s) for _, group in groups for s in group]
    return [" & ".join(spans) + r" \\", "".join(rules), " & ".join(keys + shorts) + r" \\"]


def latex(table: Table) -> str:
    """A booktabs table float (needs only \\usepackage{booktabs}); \\input it into a paper."""
    spec = "l" * len(table.keys) + "r" * len(headers(table))
    body = [" & ".join(tex_escape(c) for c in r.keys + formatted(r, table)) + r" \\" for r in table.rows]
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
def write_table(table: Table, folder: Path) -> None:
    """<folder>/<name>.{md,csv,tex}"""
    renderers = {"md": markdown, "csv": to_csv, "tex": latex}
    for ext in TABLE_FORMATS:
        atomic_write_text(renderers[ext](table), folder / f"{table.name}.{ext}")


# --- the command line of a table writer ------------------------------------------------------
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
