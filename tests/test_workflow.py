"""The whole DAG through Snakemake on the tiny preset: every stage real, end to end."""
import csv
import json

import pytest

from conftest import REPO, run, snakemake_bin

TINY = ["--configfile", "workflow/config/presets/tiny.yaml"]


def snakemake(results, *args, timeout=900):
    return run([snakemake_bin(), *TINY, "--config", f"results={results}", "--cores", "2", *args],
               timeout=timeout)


def jobs_planned(dry_run_stdout: str) -> dict:
    """Job counts from the 'Job stats' table of a dry run."""
    lines = dry_run_stdout.split("Job stats:")[1].splitlines()[3:]
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_dry_run_shows_full_dag(tmp_path):
    out = snakemake(tmp_path / "results", "-n").stdout
    assert jobs_planned(out) == {"synthetic": 1, "convert": 2, "pretrain": 4, "probe": 4,
                                 "detect": 4, "tables": 1, "all": 1}


def test_lint_is_clean():
    proc = run([snakemake_bin(), "--lint"], timeout=120)
    assert "Congratulations" in proc.stdout + proc.stderr


def test_bad_config_fails_at_dag_build(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain:\n  K: 100\n  batch_size: 64\n")
    proc = run([snakemake_bin(), *TINY, "--configfile", str(bad), "--config", f"results={tmp_path}", "-n"],
               check=False, timeout=120)
    assert proc.returncode != 0
    assert "K=100 is not a multiple of the global batch size 64" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_tiny_workflow_end_to_end(tmp_path):
    results = tmp_path / "results"
    snakemake(results)
    cells = sorted(p.name for p in (results / "cells").iterdir())
    assert cells == ["K=128", "base", "m=0.9", "method=random"]
    for cell in cells:
        probe = json.loads((results / "cells" / cell / "probe.json").read_text())
        assert probe["mode"] == "cached" and 0 <= probe["top1"] <= probe["top5"] <= 100
        det = json.loads((results / "cells" / cell / "detect.json").read_text())
        assert {"AP", "AP50", "AP75"} <= set(det)
        assert (results / "logs" / "pretrain" / f"{cell}.log").is_file()
        assert (results / "benchmarks" / "pretrain" / f"{cell}.tsv").is_file()
    rows = list(csv.DictReader((results / "cells" / "base" / "pretrain" / "log.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(float(r["loss"]) > 0 and 0 <= float(r["inst_acc"]) <= 100 for r in rows)
    # K=256 at batch 64: the oldest key in the queue is K/B = 4 steps old
    assert float(rows[-1]["queue_age_max"]) == 256 / 64
    main = (results / "tables" / "main.md").read_text()
    assert "random init" in main and "MoCo (base cell)" in main
    assert (results / "tables" / "ablation_K.md").is_file() and (results / "tables" / "ablation_m.md").is_file()
    # a second run has nothing to do: nothing already computed is redone
    again = snakemake(results, "-n").stdout
    assert "Nothing to be done" in again


@pytest.mark.slow
def test_workflow_without_ffcv(tmp_path):
    """data.loader: torchvision runs the DAG where FFCV cannot be imported: convert writes only
    the reports, and pretrain, the kNN monitor and the probe read the source images."""
    blocked = tmp_path / "no_ffcv" / "ffcv"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('ffcv is blocked in this test')\n")
    overlay = tmp_path / "torchvision.yaml"
    overlay.write_text("data:\n  loader: torchvision\ndetect:\n  enabled: false\n"
                       "pretrain:\n  knn_every: 1\n")
    results = tmp_path / "results"
    run([snakemake_bin(), *TINY, str(overlay), "--config", f"results={results}", "cell=base",
         "--cores", "2", "cell"], env={"PYTHONPATH": f"{blocked.parent}:{REPO}"}, timeout=900)
    converted = results / "data" / "ffcv"
    assert sorted(p.name for p in converted.iterdir()) == ["train.json", "val.json"]
    assert json.loads((converted / "train.json").read_text())["beton"] is None
    probe = json.loads((results / "cells" / "base" / "probe.json").read_text())
    assert 0 <= probe["top1"] <= 100
    rows = list(csv.DictReader((results / "cells" / "base" / "pretrain" / "log.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2] and all(r["knn"] for r in rows)
