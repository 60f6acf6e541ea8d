"""The claims table: one row per claim, rendered from whatever cells exist ("not run" for the
others), each verdict the direction of what was measured, never a preset answer."""

import csv
import json
import sys

import pytest
from conftest import REPO, run
from test_tables import BASE, fake_cell

from pipeline.claims import FAILS, HOLDS, NOT_RUN
from pipeline.claims import run as write_claims
from pipeline.config import ConfigError, load_yaml, validate
from pipeline.grid import claims_cells, grid_cells, group_id

CLAIMS = {"epochs": 15, "long_epochs": 30, "m": [0.0, 0.5, 0.9, 0.99, 0.999, 0.9999], "K": [4096, 16384]}
CONFIG = {
    "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 5000}},
    "pretrain": BASE,
    "probe": {"mode": "cached", "epochs": 100},
    "grid": {"seeds": 1},
    "claims": CLAIMS,
}
KEY_ENCODER_OK = {
    "holds": True,
    "key_parameters_in_optimizer": 0,
    "key_parameters_with_optimizer_state": 0,
    "key_parameters_with_grad": 0,
    "ema_replay": {"steps": 3, "max_relative_error": 2e-7},
}


def cell(results, cid, top1, failure=None, **final):
    """A cell as the pipeline writes it, with its last log row's queue values and checks."""
    fake_cell(results, cid, top1)
    path = results / "cells" / cid / "pretrain" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final"].update(final)
    summary.update(failure=failure, key_encoder=KEY_ENCODER_OK)
    path.write_text(json.dumps(summary))


def rows_by_claim(results):
    with open(results / "tables" / "claims.csv") as f:
        return list(csv.DictReader(f))


def test_claims_cells_are_the_base_varied_around_a_shorter_reference():
    cells = claims_cells(CONFIG)
    assert list(cells) == [
        "epochs=15",
        "m=0.0,epochs=15",
        "m=0.5,epochs=15",
        "m=0.9,epochs=15",
        "m=0.999,epochs=15",
        "m=0.9999,epochs=15",
        "epochs=15,queue_policy=random",
        "K=16384,epochs=15",  # K=4096 FIFO: the reference
        "K=16384,epochs=15,queue_policy=random",
        "mechanism=memory_bank,epochs=15",
        "base",
    ]  # 30 epochs: the base
    assert all(p["epochs"] == 15 for c, p in cells.items() if c != "base")


def test_the_default_grid_does_not_grow_with_the_claims():
    cfg = validate(load_yaml(REPO / "workflow" / "config" / "config.yaml"))
    shared = set(claims_cells(cfg)) & set(grid_cells(cfg))
    assert shared and {group_id(c) for c in shared} == {"base"}  # the base cell's seeds alone are shared
    with pytest.raises(ConfigError, match="long_epochs"):
        validate({**cfg, "claims": {**cfg["claims"], "long_epochs": cfg["claims"]["epochs"]}})


def test_claims_render_from_partial_results_with_not_run_rows(tmp_path):
    cell(tmp_path, "epochs=15", 60.0, queue_age_max=16, negative_drift_max=1.0)
    cell(tmp_path, "base", 65.0)
    write_claims(tmp_path, CONFIG)
    rows = rows_by_claim(tmp_path)
    assert len(rows) == 8 and [r["verdict"] for r in rows].count(NOT_RUN) == 6
    schedule = next(r for r in rows if "longer schedule" in r["claim"])
    assert schedule["verdict"] == HOLDS and "30 epochs: 65.0 vs 15 epochs: 60.0" in schedule["measured"]
    key = next(r for r in rows if "gradients" in r["claim"])
    assert key["verdict"] == HOLDS and key["measured"].startswith("2 of 2 trained runs")
    md = (tmp_path / "tables" / "claims.md").read_text()
    assert "not run: a cell the claim needs has no result yet" in md
    for name in ("claims", "claims_momentum", "claims_queue"):
        assert (tmp_path / "tables" / f"{name}.tex").read_text().count(r"\toprule") == 1


def full_results(root, **changes):
    """Every claims cell; ``changes``: cell -> (top1, failure, final) replacing the default."""
    K = {4096: 16, 16384: 64}  # K/B at batch 256
    cells = {
        "epochs=15": (60.0, None, dict(queue_age_max=16, negative_drift_max=0.5)),
        "base": (64.0, None, {}),
        "m=0.0,epochs=15": (11.0, "collapsed: loss 8.318 at chance, ln(4097) = 8.318", {}),
        "m=0.5,epochs=15": (52.0, None, {}),
        "m=0.9,epochs=15": (55.0, None, {}),
        "m=0.999,epochs=15": (59.0, None, {}),
        "m=0.9999,epochs=15": (50.0, None, {}),
        "epochs=15,queue_policy=random": (59.5, None, dict(queue_age_max=97, negative_drift_max=2.0)),
        "K=16384,epochs=15": (61.0, None, dict(queue_age_max=K[16384], negative_drift_max=1.5)),
        "K=16384,epochs=15,queue_policy=random": (60.0, None, dict(queue_age_max=300, negative_drift_max=4.0)),
        "mechanism=memory_bank,epochs=15": (45.0, None, {}),
    }
    cells.update(changes)
    for cid, (top1, failure, final) in cells.items():
        cell(root, cid, top1, failure, **final)


def test_every_claim_judged_on_what_was_measured(tmp_path):
    full_results(tmp_path)
    write_claims(tmp_path, CONFIG)
    rows = rows_by_claim(tmp_path)
    assert [r["verdict"] for r in rows] == [HOLDS] * 8
    fifo = rows[0]["measured"]
    assert (
        "K=4096 (K/B=16): max age FIFO 16, random 97" in fifo
        and "K=16384 (K/B=64): max age FIFO 64, random 300" in fifo
    )
    assert rows[2]["measured"].startswith("collapsed")  # m = 0: reported as a failure, not a number
    momentum = (tmp_path / "tables" / "claims_momentum.md").read_text()
    assert "| 0.0 | 0 | 16 | fail |" in momentum and "| 0.5 | 1 | 16 | 52.0 |" in momentum
    assert "| 0.9999 | 6,931 | 16 | 50.0 |" in momentum


@pytest.mark.parametrize(
    "cid, change, claim",
    [
        # a FIFO queue holding a key older than K/B: the bound does not hold (it would be a bug)
        ("epochs=15", (60.0, None, dict(queue_age_max=17)), 0),
        ("m=0.5,epochs=15", (61.0, None, {}), 1),  # m = 0.5 beats 0.99
        ("m=0.0,epochs=15", (40.0, None, {}), 2),  # m = 0 trained fine
        ("K=16384,epochs=15", (59.0, None, dict(queue_age_max=64)), 4),  # larger K did worse
        ("m=0.9999,epochs=15", (59.5, None, {}), 5),  # 0.9999 beat 0.999
        ("base", (58.0, None, {}), 6),  # longer was worse
        ("mechanism=memory_bank,epochs=15", (60.5, None, {}), 7),
    ],
)  # the bank beat MoCo
def test_a_claim_that_the_data_contradicts_does_not_hold(tmp_path, cid, change, claim):
    full_results(tmp_path, **{cid: change})
    write_claims(tmp_path, CONFIG)
    verdicts = [r["verdict"] for r in rows_by_claim(tmp_path)]
    assert verdicts[claim] == FAILS and verdicts.count(FAILS) == 1


def test_claims_cli_and_its_errors(tmp_path):
    full_results(tmp_path)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CONFIG))
    out = run([sys.executable, "-m", "pipeline.claims", str(tmp_path), "--config", str(cfg)])
    assert "### The seeds' claims, measured" in out.stdout and out.stdout.count(HOLDS) >= 8
    bad = run([sys.executable, "-m", "pipeline.claims", str(tmp_path / "nowhere")], check=False)
    assert bad.returncode != 0 and "results folder not found" in bad.stderr
