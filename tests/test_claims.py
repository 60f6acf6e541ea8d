"""The claims table: one row per claim, rendered from whatever cells exist ("not run" for the
others); each verdict a paired Δ by seed with its 95 % CI, or "not decidable here" with what
would decide it, known before the runs it judges; never a preset answer. Expected intervals are
computed by hand with t(0.975, 2) = 4.303 from a printed table."""

import csv
import json
import sys

import pytest
from conftest import REPO, run
from test_tables import BASE, fake_cell

from pipeline import claims, tables
from pipeline.claims import NOT_RUN, Cells, pilot_gate
from pipeline.claims import run as write_claims
from pipeline.dag.config import ConfigError, load_config, load_yaml, merge
from pipeline.dag.grid import cell_id, claims_cells, grid_cells, group_id
from pipeline.report.stats import CONTRADICTED, HOLDS, INCONCLUSIVE, NOT_DECIDABLE
from pipeline.report.studies import collect

# 10 classes x 5,000 images = 50,000 training images; batch 256: 195 steps per epoch, 2,925 in 15
CLAIMS = {
    **{"epochs": 15, "long_epochs": 30, "seeds": 3, "pilot_seeds": 2, "invariant_seeds": 2},
    **{"m": [0.0, 0.5, 0.9, 0.99, 0.999, 0.9999], "K": [4096, 16384]},
}
CONFIG = {
    "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 5000}},
    "pretrain": BASE,
    "probe": {"mode": "cached", "epochs": 100},
    "grid": {"seeds": 1},
    "detect": {"task": "detection", "cells": ["base"]},  # no Mask R-CNN, no supervised: transfer undecidable
    "claims": CLAIMS,
}
# 200,000 training images: K = 16,384 is below a tenth of them, so the queue claim is decidable
LARGE = {**CONFIG, "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 20000}}}
KEY_ENCODER_OK = {
    "holds": True,
    "key_parameters_in_optimizer": 0,
    "key_parameters_with_optimizer_state": 0,
    "key_parameters_with_grad": 0,
    "ema_replay": {"steps": 3, "max_relative_error": 2e-7},
}
ORDER = ["fifo", "low m", "m = 0", "key encoder", "larger K", "m = 0.9999", "longer", "memory bank", "transfer"]
ORDER += ["transfer norm"]
ORDER += ["mlp head", "aug plus", "patch projection"]  # the MoCo v2 report's steps, MoCo v3's ViT
ORDER += ["large batch", "queue vs batch", "byol learns", "byol predictor", "byol predictor lars", "byol ema"]
COLLAPSED = "collapsed: loss 8.318 at chance (8.318: every logit alike)"
COLLAPSED_BYOL = "collapsed: spread of the outputs 0.004 below 0.1 (every image near one point)"


def cell(results, cid, top1, failure=None, **final):
    """A cell as the pipeline writes it, with its last log row's queue values and checks (random
    init trains nothing, SimCLR has no momentum target: no key-encoder check)."""
    fake_cell(results, cid, top1)
    path = results / "cells" / cid / "pretrain" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final"].update(final)
    no_target = "method=random" in cid or "method=simclr" in cid
    summary.update(failure=failure, key_encoder=None if no_target else KEY_ENCODER_OK)
    path.write_text(json.dumps(summary))


def rows_by_claim(results):
    with open(results / "tables" / "claims.csv") as f:
        return dict(zip(ORDER, csv.DictReader(f)))


def verdicts(results) -> dict[str, str]:
    return {k: r["verdict"] for k, r in rows_by_claim(results).items()}


# role -> (override of the base cell, top1 of seeds 0, 1, 2, failure, last log row)
ROLES = {
    "reference": ({"epochs": 15}, [60.0, 50.0, 70.0], None, dict(queue_age_max=16, negative_drift_max=0.5)),
    "long": ({}, [64.0, 55.0, 73.0], None, {}),  # 30 epochs: the base cell
    "random": ({"method": "random"}, [10.0, 11.0, 9.0], None, {}),
    "m=0": ({"epochs": 15, "m": 0.0}, [10.5, 11.2, 9.4], COLLAPSED, {}),
    "m=0.5": ({"epochs": 15, "m": 0.5}, [52.0, 43.0, 63.0], None, {}),
    "m=0.9": ({"epochs": 15, "m": 0.9}, [54.0, 44.0, 64.0], None, {}),
    "m=0.999": ({"epochs": 15, "m": 0.999}, [59.0, 49.0, 69.0], None, {}),
    "m=0.9999": ({"epochs": 15, "m": 0.9999}, [50.0, 40.0, 60.0], None, {}),
    "K=4096,random": (
        {"epochs": 15, "queue_policy": "random"},
        [59.5, 49.5, 69.5],
        None,
        dict(queue_age_max=97, negative_drift_max=2.0),
    ),
    "K=16384,fifo": ({"epochs": 15, "K": 16384}, [61.0, 52.0, 70.0], None, dict(queue_age_max=64)),
    "K=16384,random": (
        {"epochs": 15, "K": 16384, "queue_policy": "random"},
        [60.0, 50.0, 70.0],
        None,
        dict(queue_age_max=300, negative_drift_max=4.0),
    ),
    "memory_bank": ({"epochs": 15, "mechanism": "memory_bank"}, [45.0, 35.0, 55.0], None, {}),
    # the MoCo v2 report's steps undone one at a time: v1's linear head, v2's augmentation without its blur
    "v1_head": ({"epochs": 15, "variant": "v1"}, [55.0, 46.0, 64.0], None, {}),
    "no_blur": ({"epochs": 15, "aug": "cifar"}, [58.0, 49.0, 68.0], None, {}),
    # the rivals: SimCLR at 256 and at 4 x 256, BYOL, without its predictor, without the EMA
    "simclr": ({"epochs": 15, "method": "simclr"}, [50.0, 41.0, 60.0], None, {}),
    "simclr_few": ({"epochs": 15, "method": "simclr", "negatives": 127}, [44.0, 36.0, 53.0], None, {}),
    "simclr_large": ({"epochs": 15, "method": "simclr", "batch_size": 1024}, [59.0, 50.0, 69.0], None, {}),
    "byol": ({"epochs": 15, "method": "byol"}, [40.0, 35.0, 45.0], None, {}),
    "byol_no_predictor": (
        {"epochs": 15, "method": "byol", "predictor": False},
        [10.2, 11.1, 9.3],
        COLLAPSED_BYOL,
        {},
    ),
    # the paper's recipe at batch 256: LARS, lr 0.2 x 256/256, weight decay 1.5e-6
    "byol_no_predictor_lars": (
        {"epochs": 15, "method": "byol", "predictor": False, "optimizer": "lars", "lr": 0.2, "weight_decay": 1.5e-6},
        [30.0, 28.0, 33.0],
        None,
        {},
    ),
    "byol_no_ema": ({"epochs": 15, "method": "byol", "m": 0.0}, [10.0, 12.0, 8.0], COLLAPSED_BYOL, {}),
}


def seed_cell(override: dict, seed: int) -> str:
    return cell_id(BASE, merge(BASE, {**override, "seed": seed}))


# the pilot: the reference and random init at seeds 3 and 4 (after claims.seeds), never compared
PILOT = {"reference": [58.0, 62.0], "random": [10.0, 10.5]}


def pilot_results(root, reference=PILOT["reference"], random=PILOT["random"]):
    for s, (ref, rand) in enumerate(zip(reference, random), start=3):
        cell(root, seed_cell({"epochs": 15}, s), ref)
        cell(root, seed_cell({"method": "random"}, s), rand)


def full_results(root, seeds=(0, 1, 2), pilot=True, **changes):
    """Every claims cell, seeds 0-2, and the pilot's; ``changes``: role -> (top1 per seed,
    failure, last log row)."""
    for role, (override, top1, failure, final) in ROLES.items():
        top1, failure, final = changes.get(role, (top1, failure, final))
        for s in seeds:
            fail = failure[s] if isinstance(failure, list) else failure
            cell(root, seed_cell(override, s), top1[s], fail, **(final[s] if isinstance(final, list) else final))
    if pilot:
        pilot_results(root)


def test_claims_cells_are_the_base_varied_around_a_shorter_reference():
    cells = {cid: cell.pretrain for cid, cell in claims_cells(load_config(CONFIG)).items()}
    groups = list(dict.fromkeys(group_id(c) for c in cells))
    assert groups == [
        "epochs=15",
        "m=0.0,epochs=15",
        "m=0.5,epochs=15",
        "m=0.9,epochs=15",
        "epochs=15,queue_policy=random",
        "K=16384,epochs=15",  # K=4096 FIFO: the reference
        "K=16384,epochs=15,queue_policy=random",
        "mechanism=memory_bank,epochs=15",
        "base",  # 30 epochs: the base
        "method=random",  # random init: m = 0's direct measure
        "variant=v1,epochs=15",  # v1's linear head (the MLP head's claim)
        "epochs=15,aug=cifar",  # v2's augmentation without its blur (aug+'s claim)
        "method=simclr,epochs=15",
        "method=simclr,epochs=15,negatives=127",  # a quarter of a view's 510 negatives
        "method=simclr,epochs=15,batch_size=1024",
        "method=byol,epochs=15",
        "method=byol,epochs=15,predictor=false",
        "method=byol,epochs=15,lr=0.2,predictor=false,optimizer=lars",  # the paper's recipe at batch 256
        "method=byol,m=0.0,epochs=15",
    ]
    # claims.seeds = 3 of each cell a decidable claim needs, paired by seed; the reference and
    # random init also at the pilot seeds 3 and 4. No run of m = 0.999 or 0.9999: only "m = 0.9999
    # is too slow" needs them, and 2,925 steps are not 5 of its half-lives (34,656)
    # The cells only the FIFO bound needs get claims.invariant_seeds = 2: random replacement at
    # both K, and K = 16,384 FIFO (the queue-size claim that would compare it is undecidable:
    # 16,384 > a tenth of 50,000 images)
    seeds = {g: sorted(cells[c].seed for c in cells if group_id(c) == g) for g in groups}
    pilot = ("epochs=15", "method=random")
    invariant = ("epochs=15,queue_policy=random", "K=16384,epochs=15", "K=16384,epochs=15,queue_policy=random")
    assert seeds == {g: [0, 1, 2, 3, 4] if g in pilot else [0, 1] if g in invariant else [0, 1, 2] for g in groups}
    # with enough steps (200 epochs: 39,000 >= 34,656) m = 0.999 and 0.9999 get 3 as well: 9
    # compared groups x 3, the 3 invariant ones x 2, the pilot's 2 roles x 2
    longer = claims_cells(load_config({**CONFIG, "claims": {**CLAIMS, "epochs": 200, "long_epochs": 400}}))
    assert len(longer) == (9 + 2 + 7) * 3 + 3 * 2 + 2 * 2  # + the v2 report's 2 steps, the 7 rivals' cells
    assert all(p.epochs == 15 for c, p in cells.items() if group_id(c) not in ("base", "method=random"))


def test_the_default_grid_does_not_grow_with_the_claims():
    cfg = load_yaml(REPO / "workflow" / "config" / "config.yaml")
    # the claims share only the base cell and the random-init baseline with the grid
    typed = load_config(cfg)
    assert {group_id(c) for c in set(claims_cells(typed)) & set(grid_cells(typed))} <= {"base", "method=random"}
    assert cfg["claims"]["seeds"] >= 3
    with pytest.raises(ConfigError, match="long_epochs"):
        load_config({**cfg, "claims": {**cfg["claims"], "long_epochs": cfg["claims"]["epochs"]}})


def test_claims_render_from_partial_results_with_not_run_rows(tmp_path):
    cell(tmp_path, "epochs=15", 60.0, queue_age_max=16, negative_drift_max=1.0)
    cell(tmp_path, "base", 65.0)
    cell(tmp_path, "method=random", 10.0)
    write_claims(tmp_path, CONFIG)
    got = verdicts(tmp_path)
    assert [got[k] for k in ("fifo", "low m", "m = 0", "memory bank")] == [NOT_RUN] * 4
    assert got["key encoder"] == HOLDS and rows_by_claim(tmp_path)["key encoder"]["measured"].startswith("2 of 2")
    # what the budget cannot decide is said before anything runs, with what would decide it
    assert got["m = 0.9999"] == (
        f"{NOT_DECIDABLE} (a priori: needs ≥ 34,656 steps, has 2,925: claims.epochs ≥ 178 at 195 steps/epoch)"
    )  # 5 half-lives of 0.9999: 5 ln 0.5 / ln 0.9999 = 34,655.6
    assert got["larger K"] == f"{NOT_DECIDABLE} (a priori: needs K ≤ 5,000; K = 16,384 too large for this data)"
    assert got["longer"] == NOT_RUN  # its pilot runs have not run
    md = (tmp_path / "tables" / "claims.md").read_text()
    assert "not run: a cell the claim needs has no result yet" in md
    assert "This budget (15 epochs = 2,925 steps of batch 256, 3 seeds) cannot decide: A larger queue helps; " in md
    for name in ("claims", "claims_momentum", "claims_queue"):
        assert (tmp_path / "tables" / f"{name}.tex").read_text().count(r"\toprule") == 1


def test_every_claim_judged_on_what_was_measured(tmp_path):
    full_results(tmp_path)
    write_claims(tmp_path, CONFIG)
    got, rows = verdicts(tmp_path), rows_by_claim(tmp_path)
    assert got == {
        "fifo": HOLDS,
        "low m": HOLDS,
        "m = 0": HOLDS,
        "key encoder": HOLDS,
        "larger K": got["larger K"],  # not decidable on 50,000 images (above)
        "m = 0.9999": got["m = 0.9999"],
        "longer": HOLDS,
        "memory bank": HOLDS,
        "transfer": got["transfer"],  # CONFIG runs no supervised baseline, no Mask R-CNN: below
        "transfer norm": got["transfer norm"],
        "mlp head": HOLDS,
        "aug plus": HOLDS,
        "patch projection": NOT_RUN,  # CONFIG's grid has no MoCo v3 ViT (tests/test_claims_v2_v3.py)
        "large batch": HOLDS,
        "queue vs batch": HOLDS,
        "byol learns": HOLDS,
        "byol predictor": HOLDS,
        "byol predictor lars": INCONCLUSIVE,  # no collapse in 15 epochs: shorter than the source's 300
        "byol ema": HOLDS,
    }
    assert got["larger K"].startswith(NOT_DECIDABLE) and got["m = 0.9999"].startswith(NOT_DECIDABLE)
    fifo = rows["fifo"]["measured"]
    # the random-replacement cells and K = 16,384 FIFO (only this claim needs them): claims.invariant_seeds
    assert "K=4096 (K/B=16): max age FIFO 16 (3 seeds), random 97 (2 seeds)" in fifo
    assert "K=16384 (K/B=64): max age FIFO 64 (2 seeds), random 300 (2 seeds)" in fifo
    # m = 0.5 − m = 0.99 by seed: -8, -7, -7: mean -7.33, std 0.577, half 4.303 * 0.577 / sqrt(3) = 1.43,
    # CI [-8.8, -5.9]: below 0 and reaching the claimed ~5 points
    assert "m=0.5,epochs=15 − epochs=15: Δ -7.3 ± 1.4 (n=3)" in rows["low m"]["measured"]
    assert "m=0.9,epochs=15 − epochs=15: Δ -6.0 ± 0.0 (n=3)" in rows["low m"]["measured"]
    # the size beside the verdict: both losses lie entirely beyond the claimed 5 points
    assert rows["low m"]["size"] == (
        "m=0.5,epochs=15 − epochs=15: larger than claimed; m=0.9,epochs=15 − epochs=15: larger than claimed"
    )
    assert rows["low m"]["seeds to decide"] == "—"  # decided: nothing more to ask
    # m = 0: every seed collapsed, and its probe is at random init's level: 0.5, 0.2, 0.4 above it,
    # mean 0.367, std 0.153, half 4.303 * 0.153 / sqrt(3) = 0.38: the CI includes 0
    zero = rows["m = 0"]["measured"]
    assert zero.startswith("3 of 3 seeds failed by the loss rule") and "Δ +0.4 ± 0.4 (n=3)" in zero
    # longer: 4, 5, 3: mean 4, std 1, half 4.303 / sqrt(3) = 2.48
    assert "base − epochs=15: Δ +4.0 ± 2.5 (n=3)" in rows["longer"]["measured"]
    # the reference − v1's linear head: 5, 4, 6: mean 5, std 1, half 2.48: CI [+2.5, +7.5] above 0;
    # − no blur: 2, 1, 2: mean 1.67, std 0.577, half 4.303 x 0.577 / sqrt 3 = 1.43: [+0.2, +3.1]
    assert rows["mlp head"]["measured"].startswith("epochs=15 − variant=v1,epochs=15: Δ +5.0 ± 2.5 (n=3)")
    assert rows["aug plus"]["measured"].startswith("epochs=15 − epochs=15,aug=cifar: Δ +1.7 ± 1.4 (n=3)")
    # decided before the runs it judges: the pilot's seeds 3, 4 (58 − 10, 62 − 10.5) learnt something
    assert "pilot runs (seeds 3–4, not compared)" in rows["longer"]["needs"]
    # 5 half-lives of 0.99: 5 ln 0.5 / ln 0.99 = 5 x 68.97 = 344.8
    assert rows["low m"]["needs"].startswith("≥ 345 steps (5 EMA half-lives of m = 0.99)")
    # SimCLR with all 510 negatives − with 127: 6, 5, 7: mean 6, std 1, half 4.303 / sqrt 3 = 2.48
    assert (
        "method=simclr,epochs=15 − method=simclr,epochs=15,negatives=127: Δ +6.0 ± 2.5 (n=3)"
        in (rows["large batch"]["measured"])
    )
    assert rows["large batch"]["needs"].startswith("510 against 127 negatives a view, both at batch 256, 2,925 steps")
    # 50,000 images // 1,024 = 48 steps an epoch, x 15 = 720 >= 5 half-lives of the reference's m = 0.99 (345)
    assert rows["queue vs batch"]["needs"].startswith("a batch of 1,024 (4 x 256): 720 steps in 15 epochs, ≥ 345")
    # the reference − SimCLR at 1,024: 1, 0, 1: mean 0.667, std 0.577; 90 % half-width
    # t(0.95, 2) = 2.920 x 0.577 / sqrt 3 = 0.97: [-0.3, +1.6], inside ±5
    assert "90 % CI [-0.3, +1.6] inside ±5" in rows["queue vs batch"]["measured"]
    # BYOL − random init: 30, 24, 36; without its predictor, and without the EMA, every seed
    # collapsed by BYOL's own rule: the BYOL paper's reading
    assert "method=byol,epochs=15 − method=random: Δ +30.0" in rows["byol learns"]["measured"]
    assert rows["byol predictor"]["measured"].startswith("3 of 3 seeds collapsed; probe")
    assert rows["byol predictor lars"]["measured"].endswith("neither reading, shorter than the source's 300 epochs")
    assert rows["byol ema"]["measured"].endswith("the BYOL paper's reading")
    # Holm over the 9 paired tests (dof 2: p = 1 − t / sqrt(2 + t²)): low m's two (Δ -6 ± 0: p 0;
    # t 22: 0.0021), the memory bank's (p 0), the match's one-sided 0.0029, large batch's (t 10.4:
    # 0.0093) reject at 0.05/9, /8, /7, /6, /5; the MLP head's (t 8.66: 0.0131) exceeds 0.05/4 and
    # stops it: BYOL's (0.0131), the longer schedule's (t 6.93: 0.0202), aug+'s (t 5: 0.0377) with it
    md = (tmp_path / "tables" / "claims.md").read_text()
    assert "Multiplicity: 9 paired tests behind 8 claims, each read at 5 %." in md
    assert (
        "these stay decided: m < 0.99 loses accuracy; A memory bank's stale keys do worse than MoCo's queue; "
        "In-batch negatives need a large batch; MoCo's queue at batch 256 matches SimCLR at 1,024; these do not: "
        "A longer schedule helps; An MLP projection head helps; Gaussian blur added to the augmentation helps; "
        "BYOL learns without negatives."
    ) in md
    momentum = (tmp_path / "tables" / "claims_momentum.md").read_text()
    assert "| 0.0 | 0 | 16 | fail (3 of 3) |" in momentum
    assert "| 0.5 | 1 | 16 | 52.7 ± 24.9 (n=3) |" in momentum  # 52, 43, 63: std 10.02, half 4.303 * 10.02 / sqrt 3
    # m = 0.9999 is no claims cell at this budget (undecidable): a result in the folder is not read
    assert "| 0.9999 | 6,931 | 16 | — |" in momentum


def byol_no_ema_at(root, epochs, top1, failures=(None, None, None)):
    """tau = 0 and random init alone, seeds 0-2, at a claims length of ``epochs``."""
    for s, (t, f) in enumerate(zip(top1, failures)):
        cell(root, seed_cell({"epochs": epochs, "method": "byol", "m": 0.0}, s), t, f)
        cell(root, seed_cell({"method": "random"}, s), [10.0, 11.0, 9.0][s])


SOURCE_LENGTH = {**CONFIG, "claims": {**CLAIMS, "epochs": 300, "long_epochs": 600}}


def test_byol_learning_without_the_ema_is_simsiams_reading_only_at_the_sources_length(tmp_path):
    """No seed of tau = 0 collapses and its probe lies above random init (20, 13, 26): at the BYOL
    paper's 300 epochs the data side with SimSiam; at 15 a run without collapse decides nothing.
    One collapsed seed of three decides neither; a diverged run is a failure, not a collapse."""
    byol_no_ema_at(tmp_path, 300, [30.0, 24.0, 35.0])
    write_claims(tmp_path, SOURCE_LENGTH)
    row = rows_by_claim(tmp_path)["byol ema"]
    assert row["verdict"] == CONTRADICTED and row["measured"].endswith("SimSiam's reading: no EMA needed")
    full_results(tmp_path, byol_no_ema=([30.0, 24.0, 35.0], None, {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["byol ema"]
    assert row["verdict"] == INCONCLUSIVE and row["measured"].endswith("shorter than the source's 300 epochs")
    assert row["seeds to decide"] == "— (no seed count: a run without collapse decides only at ≥ 300 epochs)"
    full_results(tmp_path, byol_no_ema=([30.0, 24.0, 10.0], [None, None, COLLAPSED_BYOL], {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["byol ema"]
    assert row["verdict"] == INCONCLUSIVE and row["measured"].startswith("1 of 3 seeds collapsed")
    diverged = "diverged: loss nan at epoch 3"
    full_results(tmp_path, byol_no_ema=([10.0, 12.0, 8.0], [COLLAPSED_BYOL, COLLAPSED_BYOL, diverged], {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["byol ema"]
    assert row["verdict"] == INCONCLUSIVE
    assert row["measured"].startswith("2 of 3 seeds collapsed, 1 diverged (failed, not collapsed)")


def test_undecided_rivals_say_what_more_seeds_would_decide(tmp_path):
    """The reference − SimCLR at 1,024: -1, -5, -3: mean -3, std 2, 90 % half-width t(0.95, 2) =
    2.920 x 2 / sqrt 3 = 3.37: [-6.4, +0.4] reaches past -5; inside at n with t(0.95, n - 1) x 2 /
    sqrt n < 2: n = 4: 2.353; n = 5: 2.132 x 2 / 2.236 = 1.91. tau = 0 − random init: 2, 0, 4:
    no seed collapsed, 95 % CI +2 ± 4.97 includes 0; above 0 at t(0.975, n - 1) x 2 / sqrt n < 2:
    n = 6: 2.571 x 2 / 2.449 = 2.10; n = 7: 2.447 x 2 / 2.646 = 1.85."""
    full_results(tmp_path, simclr_large=([61.0, 55.0, 73.0], None, {}))
    write_claims(tmp_path, CONFIG)
    queue = rows_by_claim(tmp_path)["queue vs batch"]
    assert queue["verdict"] == INCONCLUSIVE and "90 % CI [-6.4, +0.4] reaches past ±5" in queue["measured"]
    assert queue["smallest detectable Δ"] == "±3.4 (90 % CI) at n = 3"
    assert queue["seeds to decide"] == "5 for the 90 % CI inside ±5 at Δ -3.0"
    byol_no_ema_at(tmp_path, 300, [12.0, 11.0, 13.0])  # at the source's length
    write_claims(tmp_path, SOURCE_LENGTH)
    ema = rows_by_claim(tmp_path)["byol ema"]
    assert ema["verdict"] == INCONCLUSIVE and ema["measured"].startswith("0 of 3 seeds collapsed")
    assert ema["seeds to decide"] == "7 for the CI above 0 at Δ +2.0, if none collapses"
    # a collapsed seed and a healthy one: no number of seeds makes every seed collapse
    full_results(tmp_path, byol_no_ema=([30.0, 24.0, 10.0], [None, None, COLLAPSED_BYOL], {}))
    write_claims(tmp_path, CONFIG)
    assert rows_by_claim(tmp_path)["byol ema"]["seeds to decide"] == "— (1 of 3 failed: neither reading at any n)"
    # none collapsed, but 1 point below random init on every seed: more seeds only confirm it is not above
    byol_no_ema_at(tmp_path, 300, [9.0, 10.0, 8.0])
    write_claims(tmp_path, SOURCE_LENGTH)
    row = rows_by_claim(tmp_path)["byol ema"]
    assert row["verdict"] == INCONCLUSIVE
    assert row["seeds to decide"] == "— (none collapsed and its Δ over random init is not above 0)"


def test_simclr_at_the_large_batch_far_from_moco_contradicts_the_match(tmp_path):
    """The reference − SimCLR at 1,024: 20, 19, 21: the 95 % CI [+17.5, +22.5] lies outside ±5."""
    full_results(tmp_path, simclr_large=([40.0, 31.0, 49.0], None, {}))
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["queue vs batch"] == CONTRADICTED


def test_a_failed_run_of_simclr_at_the_large_batch_leaves_the_match_undecided(tmp_path):
    full_results(tmp_path, simclr_large=([59.0, 50.0, 69.0], [None, "diverged: loss nan at epoch 2", None], {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["queue vs batch"]
    assert row["verdict"] == INCONCLUSIVE and "1 of 3 seeds failed" in row["measured"]


def test_a_large_batch_the_data_cannot_fill_is_not_decidable_a_priori():
    """4 x 256 = 1,024 images a batch from 500: not one step; known from the config alone."""
    from pipeline.dag.claims_plan import Budget, large_batch

    assert large_batch(Budget(images=500, classes=10, batch=256, epochs=15, m=0.99, byol_m=0.99), 0.99) == (
        "a batch of 1,024 (4 x 256): 0 steps in 15 epochs, ≥ 345 (5 EMA half-lives of the reference's m = 0.99)",
        "needs ≥ 1,024 training images for one batch of 1,024, has 500",
    )


def test_simclr_at_the_large_batch_shorter_than_the_references_ema_is_not_decidable_a_priori():
    """The embedded data: 2,600 images, batch 64 x 4 = 256: 10 steps an epoch, 90 in 9 epochs,
    fewer than 5 half-lives of m = 0.99 (5 ln 0.5 / ln 0.99 = 344.8): 35 epochs would do."""
    from pipeline.dag.claims_plan import Budget, large_batch

    text, why = large_batch(Budget(images=2600, classes=10, batch=64, epochs=9, m=0.99, byol_m=0.99), 0.99)
    assert text.startswith("a batch of 256 (4 x 64): 90 steps in 9 epochs")
    assert why == "SimCLR at 256 has 90 steps, needs ≥ 345: claims.epochs ≥ 35"


def test_the_queue_claim_on_data_large_enough_to_decide_it(tmp_path):
    full_results(tmp_path)
    write_claims(tmp_path, LARGE)
    # K = 16,384 − 4,096 by seed: 1, 2, 0: mean 1, std 1, half 2.48: CI [-1.5, 3.5] includes 0
    row = rows_by_claim(tmp_path)["larger K"]
    assert row["verdict"] == INCONCLUSIVE and "Δ +1.0 ± 2.5 (n=3) (95 % CI [-1.5, +3.5] includes 0)" in row["measured"]
    # what would decide it: these 3 seeds detect ±2.5; a Δ of +1.0 at std 1 needs t / sqrt(n) < 1:
    # n = 6: 2.571 / 2.449 = 1.05; n = 7: 2.447 / 2.646 = 0.925
    assert (row["smallest detectable Δ"], row["seeds to decide"]) == ("±2.5 at n = 3", "7 for Δ +1.0")
    assert row["needs"].startswith("K ≤ 20,000 (10% of 200,000 training images; a queue then holds ≤ 2,000 of")


@pytest.mark.parametrize(
    "role, change, claim",
    [
        # a FIFO queue holding a key older than K/B: the bound does not hold (it would be a bug)
        ("reference", ([60.0, 50.0, 70.0], None, [dict(queue_age_max=16), dict(queue_age_max=17), {}]), "fifo"),
        ("m=0.5", ([62.0, 52.0, 72.0], None, {}), "low m"),  # m = 0.5 beats 0.99 by 2 on every seed
        ("m=0", ([40.0, 41.0, 39.0], None, {}), "m = 0"),  # m = 0 trained: 30 above random init
        ("long", ([58.0, 48.0, 68.0], None, {}), "longer"),  # longer was worse on every seed
        ("memory_bank", ([60.5, 51.0, 71.0], None, {}), "memory bank"),  # the bank beat MoCo: CI [0.1, 1.6]
    ],
)
def test_a_claim_that_the_data_contradicts(tmp_path, role, change, claim):
    full_results(tmp_path, **{role: change})
    write_claims(tmp_path, CONFIG)
    got = verdicts(tmp_path)
    assert got[claim] == CONTRADICTED and list(got.values()).count(CONTRADICTED) == 1


def test_a_larger_queue_that_does_worse_contradicts_it(tmp_path):
    full_results(tmp_path, **{"K=16384,fifo": ([59.0, 49.0, 69.0], None, dict(queue_age_max=64))})
    write_claims(tmp_path, LARGE)
    assert verdicts(tmp_path)["larger K"] == CONTRADICTED


def test_a_failed_run_of_a_setting_claimed_to_lose_is_its_evidence(tmp_path):
    # m = 0.5 diverged on seed 1 (its probe: 43): the claim is that it loses, so the failure counts
    # at its probe: Δ -8, -7, -7 as if it had not failed: -7.3 ± 1.4, CI [-8.8, -5.9]
    full_results(tmp_path, **{"m=0.5": ([52.0, 43.0, 63.0], [None, "diverged: loss nan at epoch 2", None], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["low m"]
    assert row["verdict"] == HOLDS
    assert "m=0.5,epochs=15 − epochs=15: Δ -7.3 ± 1.4 (n=3), 1 of 3 failed as claimed" in row["measured"]
    momentum = (tmp_path / "tables" / "claims_momentum.md").read_text()
    assert "57.5 ± 69.9 (n=2; 1 of 3 failed)" in momentum  # 52, 63: std 7.78, half 12.706 * 7.78 / sqrt 2


def test_a_collapsed_memory_bank_without_a_probe_counts_at_chance(tmp_path):
    # the bank collapsed on seed 0 and its probe never ran: chance, 100 / 10 classes = 10.
    # Δ vs the reference 10 − 60, 35 − 50, 55 − 70 = -50, -15, -15: mean -26.67, std 20.21,
    # half 4.303 * 20.21 / sqrt 3 = 50.2: CI [-76.9, +23.5] includes 0 (a collapse is no proof alone)
    full_results(tmp_path, memory_bank=([None, 35.0, 55.0], [COLLAPSED, None, None], {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["memory bank"]
    assert row["verdict"] == INCONCLUSIVE and "Δ -26.7 ± 50.2 (n=3), 1 of 3 failed as claimed" in row["measured"]
    # -15, -15 alone would hold: the failure counts for the claim, not against it
    full_results(tmp_path, memory_bank=([45.0, 35.0, 55.0], [COLLAPSED, None, None], {}))
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["memory bank"] == HOLDS


def test_a_failed_run_elsewhere_is_counted_not_dropped(tmp_path):
    # the longer run diverged on seed 1: "longer helps" is not a claim about failure
    full_results(tmp_path, long=([64.0, 5.0, 73.0], [None, "diverged: loss nan at epoch 9", None], {}))
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["longer"]
    assert row["verdict"] == INCONCLUSIVE and "1 of 3 seeds failed" in row["measured"]


def test_one_seed_is_inconclusive(tmp_path):
    full_results(tmp_path)
    for s in (1, 2):  # m = 0.5 ran one seed only
        for f in (tmp_path / "cells" / seed_cell({"epochs": 15, "m": 0.5}, s)).rglob("*.json"):
            f.unlink()
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["low m"]
    assert row["verdict"] == INCONCLUSIVE and "Δ -8.0 (n=1) (n = 1: no interval)" in row["measured"]
    for s in (1, 2):  # SimCLR at 1,024 too: one seed cannot show a match
        for f in (tmp_path / "cells" / seed_cell(ROLES["simclr_large"][0], s)).rglob("*.json"):
            f.unlink()
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["queue vs batch"]
    assert row["verdict"] == INCONCLUSIVE and row["measured"].endswith("(one seed: no interval)")


def test_a_pilot_that_learnt_nothing_decides_no_accuracy_claim(tmp_path):
    # the pilot reference 10.5, 12.0 vs random init 10.0, 10.5 at seeds 3, 4: Δ 0.5, 1.5,
    # mean 1.0, std 0.707, half 12.706 * 0.707 / sqrt 2 = 6.35: CI [-5.4, +7.4] includes 0
    full_results(tmp_path, pilot=False)
    pilot_results(tmp_path, reference=[10.5, 12.0])
    write_claims(tmp_path, CONFIG)
    got = verdicts(tmp_path)
    why = (
        f"{NOT_DECIDABLE} (pilot runs: the reference is not above random init (Δ +1.0 ± 6.4 (n=2), "
        "95 % CI [-5.4, +7.4] includes 0): needs a longer run)"
    )
    assert got["low m"] == got["longer"] == got["memory bank"] == got["mlp head"] == got["aug plus"] == why
    assert got["fifo"] == got["key encoder"] == got["m = 0"] == HOLDS  # not accuracy comparisons


def test_the_gate_never_reads_the_runs_it_judges(tmp_path):
    # the compared reference's seed 1 sits at random init's level: the old gate would have
    # called the claims undecidable; the pilot learnt, so the comparisons decide them
    full_results(tmp_path, reference=([60.0, 12.0, 70.0], None, dict(queue_age_max=16)))
    write_claims(tmp_path, CONFIG)
    rows = rows_by_claim(tmp_path)
    # memory bank − reference by seed: -15, +23, -15: mean -2.33, std 21.9, the CI includes 0
    assert rows["memory bank"]["verdict"] == INCONCLUSIVE
    assert not any(r["verdict"].startswith(NOT_DECIDABLE + " (pilot") for r in rows.values())


def test_another_claims_runs_seeds_in_the_folder_are_never_judged(tmp_path):
    # a confirmatory run (claims.first_seed 10) in the folder of an earlier one (seeds 0-2, pilot
    # 3-4): the earlier cells, all pointing the other way, change nothing it reports
    confirmatory = {**CONFIG, "claims": {**CLAIMS, "first_seed": 10}}
    for override, top1, failure, final in ROLES.values():
        for s in (10, 11, 12):
            cell(tmp_path, seed_cell(override, s), top1[s - 10], failure, **final)
    for s, (ref, rand) in enumerate(zip(PILOT["reference"], PILOT["random"]), start=13):
        cell(tmp_path, seed_cell({"epochs": 15}, s), ref)
        cell(tmp_path, seed_cell({"method": "random"}, s), rand)
    write_claims(tmp_path, confirmatory)
    alone = {k: (r["measured"], r["verdict"]) for k, r in rows_by_claim(tmp_path).items()}
    assert alone["longer"][1] == HOLDS and alone["key encoder"][0].startswith("44 of 44")  # 32 MoCo runs, 12 BYOL
    full_results(tmp_path, long=([40.0, 30.0, 50.0], None, {}))  # the earlier run: longer loses
    write_claims(tmp_path, confirmatory)
    assert {k: (r["measured"], r["verdict"]) for k, r in rows_by_claim(tmp_path).items()} == alone


def test_claims_cli_and_its_errors(tmp_path):
    full_results(tmp_path)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CONFIG))
    out = run([sys.executable, "-m", "pipeline.claims", str(tmp_path), "--config", str(cfg)])
    assert "### The seeds' claims, measured" in out.stdout and out.stdout.count(f"| {HOLDS} |") == 13
    # two a priori, and the two transfer claims: CONFIG fine-tunes no supervised cell
    assert out.stdout.count(f"| {NOT_DECIDABLE} (") == 4
    bad = run([sys.executable, "-m", "pipeline.claims", str(tmp_path / "nowhere")], check=False)
    assert bad.returncode != 0 and "results folder not found" in bad.stderr


# --- transfer: MoCo vs supervised, detection and segmentation (issue 36) --------------------------
TRANSFER = merge(
    CONFIG,
    {
        "grid": {"seeds": 3, "baselines": ["supervised"]},
        "detect": {"task": "segmentation", "cells": ["base", "method=supervised"]},
    },
)


def transfer_results(root, moco_mask, supervised_mask):
    """The main grid's base cell and supervised baseline, seeds 0-2: box AP 20, 22, 24 vs 18,
    19, 20 and the given mask AP (AP50 twice, AP75 0.8 times each)."""
    for s in range(3):
        fake_cell(root, seed_cell({}, s), 60.0, ap=[20.0, 22.0, 24.0][s], mask_ap=moco_mask[s])
        fake_cell(
            root, seed_cell({"method": "supervised"}, s), 70.0, ap=[18.0, 19.0, 20.0][s], mask_ap=supervised_mask[s]
        )


def test_the_transfer_claim_needs_the_supervised_baseline_as_mask_rcnn(tmp_path):
    """Known from the config before anything runs: what the main grid lacks to decide it."""
    write_claims(tmp_path, CONFIG)
    got = verdicts(tmp_path)["transfer"]
    assert got.startswith(f"{NOT_DECIDABLE} (a priori: needs grid.baselines with supervised; detect.task: segmentation")
    assert "grid.seeds ≥ 2 (now 1)" in got
    write_claims(tmp_path, TRANSFER)
    assert verdicts(tmp_path)["transfer"] == NOT_RUN  # decidable, not computed yet


def test_the_transfer_claim_judged_on_box_and_mask_ap(tmp_path):
    """Δ base − supervised by seed. Box AP: 2, 3, 4: mean 3, std 1, half 4.303 / sqrt 3 = 2.48, CI
    [0.5, 5.5] above 0 (AP50: 4, 6, 8; AP75: 1.6, 2.4, 3.2, above 0 likewise). Mask AP: 19, 20.5,
    22 vs 17, 18, 19: Δ 2, 2.5, 3: mean 2.5, std 0.5, half 4.303 * 0.5 / sqrt 3 = 1.24: above 0.
    Every metric above: holds. Supervised ahead in mask AP by the same: contradicted."""
    transfer_results(tmp_path, [19.0, 20.5, 22.0], [17.0, 18.0, 19.0])
    write_claims(tmp_path, TRANSFER)
    row = rows_by_claim(tmp_path)["transfer"]
    assert row["verdict"] == HOLDS
    assert "AP: Δ +3.0 ± 2.5 (n=3)" in row["measured"] and "mask AP: Δ +2.5 ± 1.2 (n=3)" in row["measured"]
    other = tmp_path / "other"
    transfer_results(other, [17.0, 18.0, 19.0], [19.0, 20.5, 22.0])
    write_claims(other, TRANSFER)
    assert rows_by_claim(other)["transfer"]["verdict"] == CONTRADICTED


# the paper's normalisation as the main protocol, frozen BN beside it on the same checkpoints
NORMALISED = merge(
    TRANSFER, {"detect": {"norm": "bn", "protocols": {"frozen": {"norm": "frozen_bn", "head_norm": "auto"}}}}
)


def frozen_protocol_results(root, moco_mask, supervised_mask):
    """Each seed's detect-frozen.json beside its detect.json: mask AP as given, box AP 10 for both."""
    for s in range(3):
        for override, mask in (({}, moco_mask[s]), ({"method": "supervised"}, supervised_mask[s])):
            path = root / "cells" / seed_cell(override, s) / "detect-frozen.json"
            path.write_text(json.dumps({"AP": 10.0, "AP50": 20.0, "AP75": 8.0, "mask_AP": mask}))


def test_the_normalisation_claim_pairs_both_protocols_by_seed(tmp_path):
    """Under the paper's normalisation MoCo − supervised in mask AP: 19 − 17, 20.5 − 18, 22 − 19 =
    2, 2.5, 3; under frozen BN: 15 − 17, 16 − 18, 18 − 19 = -2, -2, -1. Δ = 4, 4.5, 4: mean 4.17,
    std 0.289, half 4.303 x 0.289 / sqrt 3 = 0.72: above 0, holds in mask AP. Box AP: 2, 3, 4
    against 0 under frozen BN: Δ +3.0 ± 2.5, above 0 too."""
    write_claims(tmp_path, TRANSFER)  # one protocol (the default's): nothing to pair
    assert (
        verdicts(tmp_path)["transfer norm"] == f"{NOT_DECIDABLE} (a priori: needs a detection protocol with frozen BN)"
    )
    write_claims(tmp_path, NORMALISED)
    assert verdicts(tmp_path)["transfer norm"] == NOT_RUN  # decidable, no cell has run
    transfer_results(tmp_path, [19.0, 20.5, 22.0], [17.0, 18.0, 19.0])
    write_claims(tmp_path, NORMALISED)
    assert verdicts(tmp_path)["transfer norm"] == NOT_RUN  # the frozen protocol has not run
    frozen_protocol_results(tmp_path, [15.0, 16.0, 18.0], [17.0, 18.0, 19.0])
    write_claims(tmp_path, NORMALISED)
    row = rows_by_claim(tmp_path)["transfer norm"]
    assert "mask AP: Δ +4.2 ± 0.7 (n=3)" in row["measured"] and "; AP: Δ +3.0 ± 2.5 (n=3)" in row["measured"]
    assert row["measured"].startswith("AP50: Δ +6.0 ± 5.0 (n=3)")  # box AP50: 2 x box AP, against 20
    assert row["verdict"] == INCONCLUSIVE  # mask AP50 and AP75 have no frozen result: no pair


# --- the branches the tests above leave out: no pilot, a failed pilot, transfer's gaps and holes --
def test_without_pilot_seeds_the_gate_is_not_checked(tmp_path):
    # claims.pilot_seeds = 0: no pilot runs, so nothing gates the accuracy claims; the needs say so
    full_results(tmp_path, pilot=False)
    write_claims(tmp_path, {**CONFIG, "claims": {**CLAIMS, "pilot_seeds": 0}})
    rows = rows_by_claim(tmp_path)
    assert rows["longer"]["needs"] == "the reference learnt something: not checked (claims.pilot_seeds = 0)"
    assert rows["longer"]["verdict"] == rows["low m"]["verdict"] == rows["memory bank"]["verdict"] == HOLDS
    # the gate itself, on the cells as run() reads them: no pilot seeds, nothing to say
    cfg = {**CONFIG, "claims": {**CLAIMS, "pilot_seeds": 0}}
    expected = {cid: c.stated(cfg["pretrain"]) for cid, c in claims_cells(load_config(cfg)).items()}
    typed = load_config(cfg)
    cells = Cells(collect(tmp_path, expected), typed, typed.claims, tmp_path)
    assert list(cells.pilot_seeds) == [] and pilot_gate(cells) is None


def test_a_failed_pilot_run_decides_no_accuracy_claim(tmp_path):
    # the pilot reference collapsed at seed 3: of the pairs at seeds 3, 4 one failed; the other,
    # 62 − 10.5 = 51.5, is shown but decides nothing
    full_results(tmp_path, pilot=False)
    pilot_results(tmp_path)
    cell(tmp_path, seed_cell({"epochs": 15}, 3), 58.0, COLLAPSED)
    write_claims(tmp_path, CONFIG)
    got = verdicts(tmp_path)
    why = f"{NOT_DECIDABLE} (pilot runs: 1 of 2 failed (Δ vs random init +51.5 (n=1)): needs a longer or stabler run)"
    assert got["low m"] == got["longer"] == got["memory bank"] == why
    assert got["fifo"] == got["key encoder"] == got["m = 0"] == HOLDS


def test_the_transfer_claim_needs_grid_only_to_keep_both_cells(tmp_path):
    write_claims(tmp_path, merge(TRANSFER, {"grid": {"only": ["base"]}}))
    assert verdicts(tmp_path)["transfer"] == f"{NOT_DECIDABLE} (a priori: needs grid.only with both (now ['base']))"


def test_a_transfer_metric_without_a_result_is_inconclusive(tmp_path):
    # the base cell's detect.json lacks AP50 on every seed: that metric has no Δ, the rest hold
    transfer_results(tmp_path, [19.0, 20.5, 22.0], [17.0, 18.0, 19.0])
    for s in range(3):
        path = tmp_path / "cells" / seed_cell({}, s) / "detect.json"
        detect = json.loads(path.read_text())
        for d in [detect, *detect["trials"]]:
            d["AP50"] = None
        path.write_text(json.dumps(detect))
    write_claims(tmp_path, TRANSFER)
    row = rows_by_claim(tmp_path)["transfer"]
    assert row["verdict"] == INCONCLUSIVE
    assert row["measured"].startswith("AP50: no result; AP: Δ +3.0 ± 2.5 (n=3)")


def test_a_failed_transfer_seed_is_counted_not_averaged(tmp_path):
    # MoCo's base cell diverged at seed 1: seeds 0, 2 pair. Box AP Δ 2, 4: mean 3, std 1.414,
    # half 12.706 * 1.414 / sqrt 2 = 12.7; mask AP Δ 2, 3: mean 2.5, std 0.707, half 6.35
    transfer_results(tmp_path, [19.0, 20.5, 22.0], [17.0, 18.0, 19.0])
    path = tmp_path / "cells" / seed_cell({}, 1) / "pretrain" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "failure": "diverged: loss nan at epoch 2"}))
    write_claims(tmp_path, TRANSFER)
    row = rows_by_claim(tmp_path)["transfer"]
    assert row["verdict"] == INCONCLUSIVE
    assert "AP: Δ +3.0 ± 12.7 (n=2), 1 of 3 seeds failed" in row["measured"]
    assert "mask AP: Δ +2.5 ± 6.4 (n=2), 1 of 3 seeds failed" in row["measured"]


def test_claims_whose_cells_the_config_does_not_name_are_not_run(tmp_path):
    # one m (0.99, the reference's) and one K: no low m, no m = 0, no larger K, no m = 0.9999
    cfg = {**CONFIG, "claims": {**CLAIMS, "m": [0.99], "K": [4096]}}
    write_claims(tmp_path, cfg)  # no cell has run: no trained run for the key-encoder check
    rows = rows_by_claim(tmp_path)
    # the transfer claim is gated on the detection config, not on claims.m / claims.K
    omitted = ("longer", "memory bank", "transfer", "transfer norm", "mlp head", "aug plus")  # cells every config names
    assert {k: r["verdict"] for k, r in rows.items() if k not in omitted} == {
        "fifo": NOT_RUN,
        "low m": NOT_RUN,
        "m = 0": NOT_RUN,
        "key encoder": NOT_RUN,
        "larger K": NOT_RUN,
        "m = 0.9999": NOT_RUN,
        "patch projection": NOT_RUN,  # CONFIG's grid.cells has no MoCo v3 ViT
        # the rivals' claims need SimCLR's and BYOL's cells, none of which has run
        "large batch": NOT_RUN,
        "queue vs batch": NOT_RUN,
        "byol learns": NOT_RUN,
        "byol predictor": NOT_RUN,
        "byol predictor lars": NOT_RUN,
        "byol ema": NOT_RUN,
    }
    assert rows["low m"]["measured"] == "claims.m needs 0.99 and a value in (0, 0.99)"
    assert rows["m = 0"]["measured"] == "claims.m has no 0"
    assert rows["larger K"]["measured"] == "claims.K has one value"
    assert rows["m = 0.9999"]["measured"] == "claims.m lacks 0.999 or 0.9999"


def test_a_fifo_claim_of_one_seed_is_inconclusive(tmp_path):
    full_results(tmp_path, seeds=(0,))
    write_claims(tmp_path, {**CONFIG, "claims": {**CLAIMS, "K": [4096]}})  # one run of each policy
    row = rows_by_claim(tmp_path)["fifo"]
    assert row["verdict"] == INCONCLUSIVE and "max age FIFO 16 (1 seeds), random 97 (1 seeds)" in row["measured"]


def test_a_policy_whose_runs_logged_no_queue_age_is_not_judged(tmp_path):
    # random replacement's runs ended without a queue age: FIFO's bound alone decides nothing
    full_results(tmp_path, **{"K=4096,random": ([59.5, 49.5, 69.5], None, {"queue_age_max": None})})
    write_claims(tmp_path, {**CONFIG, "claims": {**CLAIMS, "K": [4096]}})
    row = rows_by_claim(tmp_path)["fifo"]
    assert (
        row["verdict"] == INCONCLUSIVE
        and row["measured"] == "K=4096 (K/B=16): max age FIFO 16 (3 seeds), random ? (0 seeds)"
    )


def test_random_replacement_that_never_keeps_an_older_key_contradicts_the_fifo_claim(tmp_path):
    # FIFO's oldest key is exactly K/B (16, 64) steps old, random's never older than K/B: the
    # claimed difference between the two policies is not there
    young = {"queue_age_max": 10, "negative_drift_max": 1.0}
    full_results(
        tmp_path,
        **{"K=4096,random": ([59.5, 49.5, 69.5], None, young), "K=16384,random": ([60.0, 50.0, 70.0], None, young)},
    )
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["fifo"] == CONTRADICTED


def test_a_fifo_bound_held_with_room_while_random_keeps_older_keys_is_inconclusive(tmp_path):
    # FIFO's oldest key 15 < K/B = 16: the bound is not reached, so its tightness is not shown
    ref = ROLES["reference"]
    full_results(tmp_path, reference=(ref[1], None, {**ref[3], "queue_age_max": 15}))
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["fifo"] == INCONCLUSIVE


def test_m0_with_one_seed_has_no_interval_and_is_inconclusive(tmp_path):
    full_results(tmp_path)
    for s in (1, 2):
        for f in (tmp_path / "cells" / seed_cell({"epochs": 15, "m": 0.0}, s)).rglob("*.json"):
            f.unlink()
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE and row["measured"].startswith("1 of 1 seeds failed")


def test_m0_whose_one_seed_did_not_fail_holds_at_random_inits_level(tmp_path):
    """A seed of m = 0 whose loss stayed below the chance rule, its probe at random init's level
    (the fourth claims run's seed 33): the probe decides it. By hand: 10.5 − 10, 11.2 − 11,
    9.4 − 9: Δ +0.37, std 0.153, half 4.303 x 0.153 / sqrt 3 = 0.38: CI [-0.0, +0.7], below +5."""
    full_results(tmp_path, **{"m=0": ([10.5, 11.2, 9.4], [COLLAPSED, None, COLLAPSED], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == HOLDS and row["measured"].startswith("2 of 3 seeds failed by the loss rule")
    assert (row["smallest detectable Δ"], row["seeds to decide"]) == ("—", "—")


def test_m0_whose_probe_reaches_past_the_margin_says_what_would_decide_it(tmp_path):
    """Probe − random init 1, 5, 3 (11 − 10, 16 − 11, 12 − 9): mean 3, std 2, half 4.303 x 2 /
    sqrt 3 = 4.97: CI [-2.0, +8.0] reaches past +5; one seed did not fail. The CI below +5 at a
    Δ of 3 and this spread needs 7 seeds (tests/test_stats.py)."""
    full_results(tmp_path, **{"m=0": ([11.0, 16.0, 12.0], [COLLAPSED, None, COLLAPSED], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE and "Δ +3.0 ± 5.0 (n=3)" in row["measured"]
    assert (row["smallest detectable Δ"], row["seeds to decide"]) == (
        "±5.0 at n = 3",
        "7 for the CI below +5 at Δ +3.0, or every seed failing by the loss rule (2 of 3 did)",
    )
    # every seed failing by the loss rule decides it, the CI being not above 0
    full_results(tmp_path, **{"m=0": ([11.0, 16.0, 12.0], COLLAPSED, {})})
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["m = 0"] == HOLDS


def test_m0_learning_past_the_margin(tmp_path):
    """Probe − random init 20, 21, 22 (30 − 10, 32 − 11, 31 − 9): CI [+18.5, +23.5] above +5:
    contradicted when no seed failed; with a failed seed the runs disagree: inconclusive."""
    full_results(tmp_path, **{"m=0": ([30.0, 32.0, 31.0], None, {})})
    write_claims(tmp_path, CONFIG)
    assert verdicts(tmp_path)["m = 0"] == CONTRADICTED
    full_results(tmp_path, **{"m=0": ([30.0, 32.0, 31.0], [None, COLLAPSED, None], {})})
    write_claims(tmp_path, CONFIG)
    row = rows_by_claim(tmp_path)["m = 0"]
    assert row["verdict"] == INCONCLUSIVE
    assert row["seeds to decide"] == "no seed failing by the loss rule (1 of 3 did)"


def test_slow_momentum_decided_on_enough_steps(tmp_path):
    # 600,000 images / 256 = 2,343 steps per epoch, x 15 = 35,145 >= 34,656 (5 half-lives of 0.9999)
    cfg = {**CONFIG, "dataset": {"source": "synthetic", "synthetic": {"train_per_class": 60000}}}
    full_results(tmp_path)
    write_claims(tmp_path, cfg)
    row = rows_by_claim(tmp_path)["m = 0.9999"]
    # m = 0.9999 − m = 0.999 by seed: 50 − 59, 40 − 49, 60 − 69 = -9 each: below 0 on every seed
    assert row["verdict"] == HOLDS and "Δ -9.0 ± 0.0 (n=3)" in row["measured"]


def test_claims_need_their_sections(tmp_path):
    with pytest.raises(ConfigError, match="pretrain and claims sections"):
        write_claims(tmp_path, {"pretrain": CONFIG["pretrain"]})
    with pytest.raises(ConfigError, match="has no 'claims' section"):
        claims_cells(load_config({"pretrain": CONFIG["pretrain"]}))


@pytest.mark.parametrize("module, prog", [(claims, "claims"), (tables, "tables")])
def test_table_writers_exit_naming_a_missing_config_file(tmp_path, module, prog):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(SystemExit) as exit_:
        module.main([str(tmp_path), "--config", str(missing)])
    assert str(exit_.value) == f"[{prog}] config file not found: {missing}"


def test_claims_only_trains_some_rows_and_the_table_reads_every_row(tmp_path):
    """claims.only names what a run trains; the table still judges every claim whose cells the
    folder holds (here all of them), and its footnote names the run's claims.only."""
    full_results(tmp_path)
    write_claims(tmp_path, merge(CONFIG, {"claims": {"only": ["byol_learns"]}}))
    got = verdicts(tmp_path)
    write_claims(tmp_path, CONFIG)
    # every row but the patch projection's: CONFIG's grid has no MoCo v3 ViT to vary
    assert got == verdicts(tmp_path) and [k for k, v in got.items() if v == NOT_RUN] == ["patch projection"]
    write_claims(tmp_path, merge(CONFIG, {"claims": {"only": ["byol_learns"]}}))
    assert "this run's claims.only: byol_learns" in (tmp_path / "tables" / "claims.md").read_text()
