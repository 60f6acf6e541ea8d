"""python -m pipeline.report.compare: two results folders of the same grid, paired by seed."""

import json
import subprocess
import sys

import pytest
from conftest import REPO
from test_tables import fake_cell

from pipeline.report import compare


def folder(root, base, supervised):
    """The base cell and the supervised baseline at seeds 0, 1, 2 (linear top-1 per seed)."""
    for seed, (b, s) in enumerate(zip(base, supervised)):
        suffix = "" if seed == 0 else f"seed={seed}"
        fake_cell(root, suffix or "base", b)
        fake_cell(root, "method=supervised" + (f",{suffix}" if suffix else ""), s)
    return root


def test_paired_deltas_and_the_equivalence_margin(tmp_path, capsys):
    a = folder(tmp_path / "fp32", [60.0, 62.0, 64.0], [90.0, 91.0, 92.0])
    # B - A: the base +1, +1, +1 (sd 0: a zero-width interval, inside +-5); supervised
    # +9, +10, +11: mean +10, sd 1, 90 % CI +10 +- t(0.95, 2) / sqrt(3) = +10 +- 1.686: outside
    b = folder(tmp_path / "bf16", [61.0, 63.0, 65.0], [99.0, 101.0, 103.0])
    rows = {r["group"]: r for r in compare.main([str(a), str(b), "--metric", "top1"])}
    assert set(rows) == {"base", "method=supervised"}
    base, sup = rows["base"], rows["method=supervised"]
    assert (base["A"], base["B"], base["delta"], base["within_margin"]) == (62.0, 63.0, "+1.0 ± 0.0 (n=3)", "holds")
    assert sup["ci90"] == "[+8.3, +11.7]" and sup["within_margin"] == "contradicted"  # 95 % CI [+7.5, +12.5]
    assert "| base | top1 | 62.0 | 63.0 |" in capsys.readouterr().out


def test_only_the_seeds_both_ran_are_paired_and_failed_runs_are_counted(tmp_path):
    a = folder(tmp_path / "a", [60.0, 62.0, 64.0], [90.0, 91.0, 92.0])
    b = tmp_path / "b"
    fake_cell(b, "base", 63.0)
    fake_cell(b, "seed=1", 65.0)
    fake_cell(b, "seed=2", 10.0, diverged=True)  # failed: out of the pairing, counted
    (row,) = compare.compare(compare.collect(a), compare.collect(b), ["top1"])
    assert row["group"] == "base" and row["delta"] == "+3.0 ± 0.0 (n=2)" and row["failed"] == 1


def test_an_unknown_metric_is_named(tmp_path):
    a = folder(tmp_path / "a", [60.0], [90.0])
    with pytest.raises(SystemExit, match=r"no column \['top7'\]"):
        compare.main([str(a), str(a), "--metric", "top7"])


def test_groups_without_a_common_seed_are_left_out_and_the_command_says_so(tmp_path):
    """A ran seed 0 of the base cell, B seed 1: nothing to pair. The command line says so."""
    a, b = tmp_path / "a", tmp_path / "b"
    fake_cell(a, "base", 60.0)
    fake_cell(b, "seed=1", 61.0)
    assert compare.compare(compare.collect(a), compare.collect(b), ["top1"]) == []
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.report.compare", str(a), str(b)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "No cell group has a seed in both folders."


def test_two_detection_protocols_of_one_folder_are_paired_and_a_missing_trial_counted(tmp_path, capsys):
    """The same checkpoints fine-tuned under detect's own protocol (A) and detect.protocols' bf16
    (B): B's metrics are read from detect-bf16.json; seed 2's bf16 trial diverged (no file), so
    seeds 0 and 1 are paired and seed 2 is counted as having a value on one side only."""
    r = tmp_path / "r"
    for seed, (own, bf16) in enumerate([(20.0, 21.0), (22.0, 22.5), (24.0, None)]):
        cell = "base" if seed == 0 else f"seed={seed}"
        fake_cell(r, cell, 60.0, ap=own)  # detect.json: box AP50 = 2 x AP
        if bf16 is not None:
            (r / "cells" / cell / "detect-bf16.json").write_text(json.dumps({"AP": bf16, "AP50": 2 * bf16}))
    rows = compare.main([str(r), str(r), "--protocol-b", "bf16", "--metric", "AP50"])
    (row,) = [x for x in rows if x["group"] == "base"]
    # AP50: A 40, 44; B 42, 45: Δ +2, +1, mean +1.5 over n = 2
    assert (row["A"], row["B"], row["one_side"], row["failed"]) == (42.0, 43.5, 1, 0)
    assert row["delta"].startswith("+1.5 ± ") and row["delta"].endswith("(n=2)")
    assert "(detection: bf16)" in capsys.readouterr().out
