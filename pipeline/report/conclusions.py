"""Whether two results folders draw the same conclusions from their tables.

    python -m pipeline.report.conclusions RESULTS_A RESULTS_B

A conclusion is what a table decides, no more: each paired Δ of a table (its CSV's
``delta_<metric>`` columns: a row against the table's reference) whose 95 % CI excludes 0, each
direction sentence under a table ("… is above / below … on this data"), and each claim's verdict
that holds or is contradicted (``claims.csv``). Each is, between the two folders: decided alike,
reversed (decided in both, opposite ways), decided in one only, or decided in neither. The order
of two means whose Δ a table leaves undecided is not a conclusion, and is not read.

What it is for: the same grid run two ways, as ``compare`` pairs their values: fp32 against the
fast path (docs/studies/2026-12-07-fast-path-default.md), one CPU or commit against another.
Prints a Markdown table of every conclusion decided in either folder, then the counts; exits
with status 1 when one is reversed.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.report import stats
from pipeline.report.writers import results_folder

ALIKE, REVERSED, ONE_ONLY, NEITHER = "alike", "REVERSED", "decided in one only", "decided in neither"
VERDICT_SIGN = {stats.HOLDS: 1, stats.CONTRADICTED: -1}
# a direction sentence (studies.direction_sentence): "<row> − <ref>, <metric>, paired by seed: Δ …"
SENTENCE = re.compile(r"^(?P<what>.+?, paired by seed): Δ (?P<delta>.+?)(?:; .+?)?: (?P<says>.+)$")


@dataclass(frozen=True)
class Conclusion:
    sign: int  # +1 above / holds, -1 below / contradicted, 0 undecided
    shown: str  # the Δ or the verdict as the table shows it


def key_columns(header: list[str]) -> list[str]:
    """A table CSV's row keys: its columns before the first metric (one with a ``_std`` beside it)."""
    first = next((i for i, c in enumerate(header) if f"{c}_std" in header), len(header))
    return header[:first]


def from_csv(path: Path) -> dict[str, Conclusion]:
    """Each paired Δ of a table CSV that has one, and each claim's verdict of a claims CSV."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows, header = list(reader), list(reader.fieldnames or [])
    found: dict[str, Conclusion] = {}
    if "verdict" in header and "claim" in header:
        for r in rows:
            claim = r["claim"].split(" (run:")[0]  # the run's description may name seeds and epochs
            found[f"claim: {claim}"] = Conclusion(VERDICT_SIGN.get(r["verdict"], 0), r["verdict"])
        return found
    keys = key_columns(header)
    metrics = [c[len("delta_") : -len("_ci95")] for c in header if c.startswith("delta_") and c.endswith("_ci95")]
    for metric in metrics:
        for r in rows:
            if r[f"delta_{metric}"] == "":
                continue  # the reference row, or no pair computed
            mean, ci = float(r[f"delta_{metric}"]), r[f"delta_{metric}_ci95"]
            half = float(ci) if ci else None  # none: one pair, no interval
            row = " ".join(r[k] for k in keys if r[k])
            d = stats.Estimate(mean, half, int(r[f"delta_{metric}_n"]))
            sign = VERDICT_SIGN.get(stats.judge(d)[0], 0)  # above 0, below 0, neither (as the sentences)
            found[f"{path.stem}: {row}, Δ {metric}"] = Conclusion(sign, d.text(signed=True))
    return found


def from_markdown(path: Path) -> dict[str, Conclusion]:
    """The direction sentences under a table."""
    found = {}
    for line in path.read_text().splitlines():
        m = SENTENCE.match(line)
        if m:
            says = m["says"]
            sign = 1 if " is above " in says else -1 if " is below " in says else 0
            found[m["what"]] = Conclusion(sign, f"Δ {m['delta']}")
    return found


def conclusions(results: Path) -> dict[str, Conclusion]:
    """Every conclusion the folder's tables state (a sentence repeated across tables, once)."""
    found: dict[str, Conclusion] = {}
    for path in sorted((results / "tables").glob("*.csv")):
        found.update(from_csv(path))
    for path in sorted((results / "tables").glob("*.md")):
        found.update(from_markdown(path))
    return found


def state(a: Conclusion, b: Conclusion) -> str:
    if a.sign and b.sign:
        return ALIKE if a.sign == b.sign else REVERSED
    return ONE_ONLY if a.sign or b.sign else NEITHER


def compare(a: dict[str, Conclusion], b: dict[str, Conclusion]) -> list[dict]:
    """One row per conclusion both folders state: A's, B's and whether they agree."""
    return [{"conclusion": k, "A": a[k].shown, "B": b[k].shown, "state": state(a[k], b[k])} for k in a if k in b]


def to_markdown(rows: list[dict], a: str, b: str, only_a: int, only_b: int) -> str:
    shown = [r for r in rows if r["state"] != NEITHER]
    lines = [
        f"Conclusions of the tables (A: {a}, B: {b}): a paired Δ whose 95 % CI excludes 0, a direction "
        "sentence, a claim's verdict\n",
        "| conclusion | A | B | |",
        "|---|---|---|---|",
        *(f"| {r['conclusion']} | {r['A']} | {r['B']} | {r['state']} |" for r in shown),
        "",
    ]
    counts = Counter(r["state"] for r in rows)
    lines.append(", ".join(f"{s}: {counts[s]}" for s in (ALIKE, REVERSED, ONE_ONLY, NEITHER)) + ".")
    if only_a or only_b:
        lines.append(f"Stated in A only: {only_a}; in B only: {only_b} (other tables or rows; not compared).")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="results folder A (the reference)")
    ap.add_argument("b", help="results folder B")
    args = ap.parse_args(argv)
    a, b = results_folder(args.a, "conclusions"), results_folder(args.b, "conclusions")
    found_a, found_b = conclusions(a), conclusions(b)
    rows = compare(found_a, found_b)
    print(to_markdown(rows, str(a), str(b), len(found_a.keys() - found_b.keys()), len(found_b.keys() - found_a.keys())))
    return 1 if any(r["state"] == REVERSED for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
