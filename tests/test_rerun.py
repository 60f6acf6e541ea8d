"""Rerunning one cell, and the tables, without retraining anything else: which jobs Snakemake
plans (dry runs) on existing results of the tiny preset. The results are faked (plausible files
with ordered mtimes); only the `tables` job really runs, then the HTML report is built."""

import json
import os
import re
import shutil
import sys
import time

import pytest
from conftest import REPO, run, snakemake_cli
from test_tables import fake_cell

from pipeline.dag.config import load_config, load_yaml, merge
from pipeline.dag.grid import grid_cells

pytestmark = pytest.mark.integration  # every test here runs Snakemake: make test-quick leaves it out

TINY = "workflow/config/presets/tiny.yaml"
CFG = merge(load_yaml(REPO / "workflow/config/config.yaml"), load_yaml(REPO / TINY))
CELLS = list(grid_cells(load_config(CFG)))  # base, K=128, m=0.9, shuffle_bn=false, method=random
METRICS = {"base": 40.0, "K=128": 35.0, "m=0.9": 30.0, "shuffle_bn=false": 32.0, "method=random": 15.0}


def snakemake(results, *args, config=(), check=True, configfiles=()):
    """snakemake [targets/options] --configfile tiny [overlays] --config results=<results> [config...]"""
    cmd = [
        *snakemake_cli(),
        *args,
        "--cores",
        "1",
        "--configfile",
        TINY,
        *map(str, configfiles),
        "--config",
        f"results={results}",
        *config,
    ]
    return run(cmd, timeout=300, check=check)


def planned_jobs(stdout: str) -> set[tuple[str, str | None]]:
    """(rule, cell wildcard or None) of every job a dry run lists."""
    jobs, rule, cell = set(), None, None
    for line in stdout.splitlines() + ["rule end:"]:
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            if rule:
                jobs.add((rule, cell))
            rule, cell = m.group(1), None
        m = re.match(r"^\s+wildcards: (.+)", line)  # "cell=K=1024,m=0.9, trial=0"
        if m and rule:
            cell = dict(w.split("=", 1) for w in m.group(1).split(", ")).get("cell")
    return {j for j in jobs if j[0] != "end"}


def cell_jobs(cell: str, *rules: str) -> set:
    return {(r, cell) for r in rules}


def fake_results(results) -> None:
    """Every output of the tiny DAG but the tables, oldest first (data, pretrain, probe/detect)."""
    data = results / "data"
    (data / "synthetic" / "det").mkdir(parents=True)
    (data / "synthetic" / "det" / "instances_train.json").write_text("{}")
    for split in ("train", "val"):
        (data / "synthetic" / "cls" / split / "disk").mkdir(parents=True, exist_ok=True)
        (data / "synthetic" / "cls" / split / "disk" / "0.png").write_bytes(b"fake")
        (data / "ffcv").mkdir(parents=True, exist_ok=True)
        (data / "ffcv" / f"{split}.beton").write_bytes(b"fake")
        (data / "ffcv" / f"{split}.json").write_text(
            json.dumps({"source": "synthetic", "num_samples": 160, "classes": ["disk"] * 10})
        )
    for cell in CELLS:
        fake_cell(results, cell, METRICS[cell], ap=METRICS[cell] / 3, base=CFG["pretrain"])
    now = time.time()
    for path in sorted(results.rglob("*")):
        rel = path.relative_to(results).as_posix()
        age = 300 if rel.startswith("data") else (200 if "/pretrain" in rel else 100)
        os.utime(path, (now - age, now - age))


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """Results of the tiny preset as after a full run: faked cells, real tables and figures."""
    results = tmp_path_factory.mktemp("rerun") / "results"
    fake_results(results)
    assert planned_jobs(snakemake(results, "-n").stdout) == {("tables", None), ("all", None)}
    snakemake(results, "tables")
    return results


def test_nothing_to_do_after_a_full_run(done):
    out = snakemake(done, "-n").stdout
    assert "Nothing to be done" in out and planned_jobs(out) == set()
    assert "| MoCo (base cell) | v2 |" in (done / "tables" / "main.md").read_text()


def test_one_new_cell_runs_only_its_jobs(done):
    out = snakemake(done, "cell", "-n", config=["cell=K=512"]).stdout
    assert planned_jobs(out) == cell_jobs("K=512", "pretrain", "probe", "detect", "detect_trials") | {("cell", None)}


def test_existing_cell_is_up_to_date(done):
    out = snakemake(done, "cell", "-n", config=["cell=K=128"]).stdout
    assert "Nothing to be done" in out


def test_rerun_one_cell_forcerun_pretrain(done):
    out = snakemake(done, "cell", "-n", "--forcerun", "pretrain", config=["cell=K=128"]).stdout
    assert planned_jobs(out) == cell_jobs("K=128", "pretrain", "probe", "detect", "detect_trials") | {("cell", None)}
    out = snakemake(done, "cell", "-n", "--forcerun", "probe", config=["cell=m=0.9"]).stdout
    assert planned_jobs(out) == cell_jobs("m=0.9", "probe") | {("cell", None)}


def test_rerun_one_cell_and_refresh_tables(done):
    ckpt = done / "cells" / "K=128" / "pretrain" / "checkpoint.pt"
    out = snakemake(done, "-n", "--forcerun", str(ckpt)).stdout
    assert planned_jobs(out) == cell_jobs("K=128", "pretrain", "probe", "detect", "detect_trials") | {
        ("tables", None),
        ("all", None),
    }


def test_rerun_one_cell_then_tables_in_two_steps(done, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(done, copy)  # keeps mtimes; this test marks a cell as rerun
    snakemake(copy, "cell", "--touch", "--forcerun", "pretrain", config=["cell=K=128"])  # as if it reran
    assert planned_jobs(snakemake(copy, "-n").stdout) == {("tables", None), ("all", None)}
    assert planned_jobs(snakemake(copy, "tables", "-n").stdout) == {("tables", None)}


def test_regenerate_tables_without_retraining(done):
    out = snakemake(done, "tables", "-n", "--forcerun", "tables").stdout
    assert planned_jobs(out) == {("tables", None)}
    main = done / "tables" / "main.md"
    stale = main.stat().st_mtime - 3600  # an hour back: rewritten, it is newer whatever the clock's resolution
    os.utime(main, (stale, stale))
    snakemake(done, "tables", "--forcerun", "tables")
    assert main.stat().st_mtime > stale
    assert "Nothing to be done" in snakemake(done, "-n").stdout


def test_regenerate_tables_without_snakemake(done, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(done, copy)
    shutil.rmtree(copy / "tables")
    shutil.rmtree(copy / "figures")
    proc = run([sys.executable, "-m", "pipeline.tables", str(copy)], timeout=300)
    assert "| MoCo (base cell) |" in proc.stdout
    assert (copy / "tables" / "ablation_K.tex").is_file() and (copy / "figures" / "curves" / "K=128.pdf").is_file()
    assert "| 128 | 35.0 (n=1) | 30.0 (n=1) |" in (copy / "tables" / "ablation_K.md").read_text()


def test_impossible_cell_is_rejected(done):
    proc = snakemake(done, "cell", "-n", config=["cell=K=100"], check=False)
    assert proc.returncode != 0
    assert "ablation cell 'K=100' is impossible" in proc.stdout + proc.stderr


def test_html_report(done):
    report = done / "report.html"
    snakemake(done, "--report", str(report))
    html = report.read_text()
    for name in ("ablation_m.md", "mechanisms.tex", "accuracy_vs_K.png", "Training curves"):
        assert name in html, name


def test_more_detection_trials_add_only_the_new_trials(done, tmp_path):
    """Raising detect.trials from 1 to 3 plans trials 1 and 2 of every cell (trial 0 is kept)
    and the summaries and tables that read them."""
    copy = tmp_path / "results"
    shutil.copytree(done, copy)
    # the summaries as Snakemake writes them (it records their inputs: faked files have no record)
    summaries = [copy / "cells" / cell / "detect.json" for cell in CELLS]
    for path in summaries:
        path.unlink()
    snakemake(copy, *map(str, summaries))
    overlay = tmp_path / "trials.yaml"
    overlay.write_text("detect:\n  trials: 3\n")
    out = snakemake(copy, "-n", "-p", configfiles=[overlay]).stdout
    jobs = planned_jobs(out)
    # a trial's parameters leave out the number of trials: trial 0 of a real run is not redone either
    commands = [line for line in out.splitlines() if "pipeline.detect --config" in line]
    assert len(commands) == 2 * len(CELLS) and not any('"trials"' in c for c in commands)
    assert {rule for rule, _ in jobs} == {"detect", "detect_trials", "tables", "all"}
    assert out.count("rule detect:") == 2 * len(CELLS)
    assert "trial=0" not in out and "trial=1" in out and "trial=2" in out
