"""A cell's detection result from its trials: the mean and sample std of every AP key (box,
and mask when the trials have it), the settings the trials share, and each trial's own numbers,
written as the cell's detect.json. The workflow's job, one per cell, imports no torch:

    python -m pipeline.transfer.summary --out results/cells/base/detect.json <trial JSONs>
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pipeline.runtime.io import atomic_write_json
from pipeline.transfer import log
from pipeline.transfer.metrics import AP_KEYS, MASK_KEYS


def summarize_trials(paths: list, out: Path) -> dict:
    """One cell's detection metrics from its trials: each AP key is the mean over the trials
    that have it, ``std`` the sample std (None for a single trial); ``trials`` lists each one."""
    trials = []
    for path in paths:
        try:
            trials.append(json.loads(Path(path).read_text()))
        except (FileNotFoundError, json.JSONDecodeError) as err:
            raise FileNotFoundError(f"detection trial unreadable: {path} ({err})") from None
    mean, std = {}, {}
    keys = [*AP_KEYS, *(MASK_KEYS if any("mask_AP" in t for t in trials) else [])]
    for key in keys:
        vals = [t[key] for t in trials if t.get(key) is not None]
        mean[key] = round(statistics.fmean(vals), 3) if vals else None
        std[key] = round(statistics.stdev(vals), 3) if len(vals) > 1 else None  # sample std
    first = trials[0]
    shared = {
        k: first[k]
        for k in (
            "epochs",
            "iterations",
            "arch",
            "method",
            "head",
            "task",
            "norm",
            "batch_size",
            "normalisation",
            "protocol",
            "checkpoint",
            "train_set",
            "val_set",
            "num_train_images",
            "num_val_images",
            "config",
        )
        if k in first
    }
    summary = {
        **mean,
        "std": std,
        "n": len(trials),
        **shared,
        "seconds": round(sum(t.get("seconds", 0) for t in trials), 1),
        "trials": [{k: t.get(k) for k in (*keys, "seed", "train_loss", "seconds")} for t in trials],
    }
    atomic_write_json(summary, out)
    shown = [k for k in ("AP", "AP50", "AP75", "mask_AP", "mask_AP50", "mask_AP75") if k in mean]
    log(
        " ".join(f"{k}={mean[k]}" + (f"±{std[k]}" if std[k] is not None else "") for k in shown)
        + f" over {len(trials)} trial(s) -> {out}"
    )
    return summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.transfer.summary", description="a cell's detect.json: the mean and std of its trials"
    )
    ap.add_argument("--out", required=True, help="the cell's detect.json")
    ap.add_argument("trials", nargs="+", help="trial metrics JSONs")
    args = ap.parse_args(argv)
    try:
        summarize_trials(args.trials, Path(args.out))
    except FileNotFoundError as err:
        raise SystemExit(f"[detect] error: {err}") from None


if __name__ == "__main__":
    main()
