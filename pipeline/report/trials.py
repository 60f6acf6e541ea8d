"""Every detection trial of a results folder, one row per cell and trial, one column per protocol:
its box and mask AP50, or why it has none; then the failures per cell group and protocol.

    python -m pipeline.report.trials RESULTS [--protocol NAME ...] [--failed-below 20]

A trial fails when its loss stops being finite (the stage stops, writes no metrics, and its log
says so) or when it finishes with box AP50 below ``--failed-below`` (a collapse: the transfer
studies' definition, docs/studies/2026-12-07-detection-protocol.md). Failed trials are listed and
counted, never dropped; one that started and neither finished nor failed is "unfinished", one that
stopped on another error shows the error. ``--protocol``: the detect.protocols entries to show
beside detect's own (``main``). Writes nothing; prints Markdown.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.base.layout import MAIN_PROTOCOL as MAIN
from pipeline.base.layout import cell_file, trial_log
from pipeline.report.records import read_json
from pipeline.report.studies import collect, seed_of
from pipeline.report.writers import results_folder

FAILED_BELOW_AP50 = 20.0
NOT_FINITE = re.compile(r"loss is not finite at epoch (\d+)")
STAGE_ERROR = "[detect] error: "
TRIAL_FILE = re.compile(r"trial(\d+)\.(json|log)$")


@dataclass(frozen=True)
class Trial:
    status: str  # ok | collapsed | diverged | error | unfinished
    box: float | None = None  # box AP50
    mask: float | None = None  # mask AP50 (a Mask R-CNN's)
    why: str = ""

    def text(self) -> str:
        aps = " / ".join("—" if v is None else f"{v:.1f}" for v in (self.box, self.mask))
        return {
            "ok": aps,
            "collapsed": f"**collapsed** {aps}",
            "diverged": f"**diverged** ({self.why})",
            "error": f"error: {self.why}",
            "unfinished": "unfinished",
        }[self.status]


def where(results: Path, cell: str, protocol: str) -> tuple[Path, Path]:
    """(metrics file, log) of a cell's trial under a protocol, {trial} left to fill."""
    name = None if protocol == MAIN else protocol
    metrics = cell_file(results, cell, "detect_trial" if name is None else "protocol_trial")
    return Path(metrics.replace("{protocol}", str(name))), Path(trial_log(results, name).replace("{cell}", cell))


def trial_numbers(results: Path, cell: str, protocol: str) -> list[int]:
    """The trials that wrote metrics or started a log."""
    found = set()
    for pattern in where(results, cell, protocol):
        if pattern.parent.is_dir():
            found |= {int(m[1]) for p in pattern.parent.iterdir() if (m := TRIAL_FILE.search(p.name))}
    return sorted(found)


def read_trial(results: Path, cell: str, protocol: str, trial: int, failed_below: float) -> Trial:
    metrics_file, log_file = (Path(str(p).format(trial=trial)) for p in where(results, cell, protocol))
    metrics = read_json(metrics_file)
    if metrics is not None:
        box, mask = metrics.get("AP50"), metrics.get("mask_AP50")
        return Trial("collapsed" if box is not None and box < failed_below else "ok", box, mask)
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    if m := NOT_FINITE.search(log):
        return Trial("diverged", why=f"loss not finite, epoch {m[1]}")
    errors = [line.partition(STAGE_ERROR)[2] for line in log.splitlines() if STAGE_ERROR in line]
    return Trial("error", why=errors[-1]) if errors else Trial("unfinished")


def table(results: Path, protocols: list[str], failed_below: float = FAILED_BELOW_AP50) -> str:
    head = "| group | seed | trial | " + " | ".join(f"{p}: box / mask AP50" for p in protocols) + " |"
    rows = [head, "|---|---:|---:|" + "---|" * len(protocols)]
    counts: dict[tuple[str, str], list[Trial]] = {}
    ordered = sorted(collect(results).iterrows(), key=lambda r: (r[1]["group"], seed_of(r[1])))
    for _, cell in ordered:
        started = {p: trial_numbers(results, cell["cell"], p) for p in protocols}
        for t in sorted(set().union(*started.values())):
            found = {p: read_trial(results, cell["cell"], p, t, failed_below) for p in protocols if t in started[p]}
            for p, trial in found.items():
                counts.setdefault((cell["group"], p), []).append(trial)
            texts = [found[p].text() if p in found else "—" for p in protocols]
            rows.append(f"| {cell['group']} | {seed_of(cell)} | {t} | " + " | ".join(texts) + " |")
    if len(rows) == 2:
        return f"No detection trial under {results}/cells."
    summary = [
        "",
        f"Failed: a loss that is not finite, or box AP50 below {failed_below:g} at the end.",
        "",
        "| group | protocol | trials | finished | failed | of which diverged | of which collapsed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (group, p), trials in sorted(counts.items()):
        n = {s: sum(t.status == s for t in trials) for s in ("ok", "collapsed", "diverged")}
        failed = n["collapsed"] + n["diverged"]
        summary.append(
            f"| {group} | {p} | {len(trials)} | {n['ok'] + n['collapsed']} | {failed} | {n['diverged']} "
            f"| {n['collapsed']} |"
        )
    return "\n".join(rows + summary)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="the results folder")
    ap.add_argument("--protocol", nargs="*", default=[], help="detect.protocols entries beside detect's own")
    ap.add_argument("--failed-below", type=float, default=FAILED_BELOW_AP50, help="box AP50 of a collapse")
    args = ap.parse_args(argv)
    out = table(results_folder(args.results, "trials"), [MAIN, *args.protocol], args.failed_below)
    print(out)
    return out


if __name__ == "__main__":
    main()
