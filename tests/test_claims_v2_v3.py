"""The MoCo v2 report's steps (an MLP head helps, aug+'s blur helps) and MoCo v3's patch
projection (a frozen random one is more stable on a ViT) as claims: their cells, the stability
measure read from the runs' logs, and each verdict on fake cells. Expected intervals by hand
with t(0.975, 2) = 4.303 from a printed table."""

import dataclasses

import pytest
from test_claims import CLAIMS, CONFIG, cell, full_results, rows_by_claim, verdicts

from pipeline.claims import NOT_RUN, largest_knn_drop
from pipeline.claims import run as write_claims
from pipeline.dag.config import load_config, merge
from pipeline.dag.grid import claims_cells, group_id
from pipeline.report.stats import CONTRADICTED, HOLDS, INCONCLUSIVE, NOT_DECIDABLE

VIT_CELL = {"variant": "v3", "backbone": "vit_tiny", "patch_size": 8, "depth": 4}
# CONFIG's grid with MoCo v3 on a ResNet (not a ViT: not the claim's cell), then the ViT; the ViT's
# recipe its paper's rule (grid.v3_vit's embedded lr unset)
VIT = merge(CONFIG, {"grid": {"cells": [{"variant": "v3"}, VIT_CELL], "v3_vit": {"lr": None}}})
VIT_ID = "variant=v3,backbone=vit_tiny,patch_size=8,depth=4"
# the ViT's recipe lr, MoCo v3's rule: AdamW 1.5e-4 per 256 images, at batch 256: 1.5e-4; x 4: 6e-4
VIT_IDS = {
    "vit_frozen": f"{VIT_ID},freeze_patch_embed=true,epochs=15",
    "vit_learned": f"{VIT_ID},freeze_patch_embed=false,epochs=15",
    "vit_frozen_high": f"{VIT_ID},freeze_patch_embed=true,epochs=15,lr=0.0006",
    "vit_learned_high": f"{VIT_ID},freeze_patch_embed=false,epochs=15,lr=0.0006",
}


def test_the_v2_steps_are_the_reference_less_one_step():
    cells = {cid: c.pretrain for cid, c in claims_cells(load_config(CONFIG)).items()}  # seed 0: no seed= part
    reference = dataclasses.asdict(cells["epochs=15"])
    assert dataclasses.asdict(cells["variant=v1,epochs=15"]) == {**reference, "variant": "v1"}
    assert dataclasses.asdict(cells["epochs=15,aug=cifar"]) == {**reference, "aug": "cifar"}


def test_the_vit_cells_vary_the_patch_projection_at_the_recipes_lr_and_4x_it():
    cells = claims_cells(load_config(VIT))
    vit = {cid: c.pretrain for cid, c in cells.items() if "vit_tiny" in cid}
    # the four roles at claims.seeds = 3 (seeds 0-2), and no other ViT cell (not the grid's own)
    assert sorted({group_id(cid) for cid in vit}) == sorted(VIT_IDS.values())
    assert sorted(p.seed for p in vit.values()) == [0] * 4 + [1] * 4 + [2] * 4
    for role, gid in VIT_IDS.items():
        p = cells[gid].pretrain
        assert (p.optimizer, p.epochs, p.knn_every, p.patch_size, p.depth) == ("adamw", 15, 1, 8, 4)
        assert p.freeze_patch_embed is ("frozen" in role)
        assert p.lr == pytest.approx(6e-4 if role.endswith("_high") else 1.5e-4)
    assert cells["epochs=15"].pretrain.knn_every == 10  # the other cells keep their monitor
    # the lr is the recipe'd cell's, the grid's v3_vit slot over the rule: 1e-4, and 4e-4
    slot = claims_cells(load_config(merge(VIT, {"grid": {"v3_vit": {"lr": 1e-4}}})))
    high = slot[f"{VIT_ID},freeze_patch_embed=false,epochs=15,lr=0.0004"].pretrain
    assert high.lr == pytest.approx(4e-4) and slot[VIT_IDS["vit_learned"]].pretrain.lr == pytest.approx(1e-4)


def test_one_epoch_shows_no_dip_and_trains_no_vit_cell(tmp_path):
    cfg = merge(VIT, {"claims": {"epochs": 1, "long_epochs": 2}})
    assert not [cid for cid in claims_cells(load_config(cfg)) if "vit_tiny" in cid]
    write_claims(tmp_path, cfg)
    why = f"{NOT_DECIDABLE} (a priori: needs claims.epochs ≥ 2 for two kNN checks, has 1)"
    assert verdicts(tmp_path)["patch projection"] == why


def test_without_a_vit_in_the_grid_the_patch_projection_is_not_run(tmp_path):
    write_claims(tmp_path, merge(CONFIG, {"grid": {"cells": [{"variant": "v3"}]}}))  # a v3 ResNet only
    row = rows_by_claim(tmp_path)["patch projection"]
    assert row["verdict"] == NOT_RUN and row["measured"].startswith("grid.cells has no MoCo v3 ViT cell")


def test_a_base_cell_without_the_steps_runs_neither(tmp_path):
    """The CIFAR-10 demo's base: v1's linear head and no blur already: nothing to take away."""
    cfg = merge(CONFIG, {"pretrain": {"variant": "v1", "aug": "cifar"}})
    assert not {"variant=v1,epochs=15", "epochs=15,aug=cifar"} & {group_id(c) for c in claims_cells(load_config(cfg))}
    write_claims(tmp_path, cfg)
    rows = rows_by_claim(tmp_path)
    assert (rows["mlp head"]["verdict"], rows["aug plus"]["verdict"]) == (NOT_RUN, NOT_RUN)
    assert rows["mlp head"]["measured"] == "the base cell has no MLP head to take away (variant v1)"
    assert rows["aug plus"]["measured"] == "the base cell's augmentation has no blur to take away (aug cifar)"


# the reference's top-1 at seeds 0-2: 60, 50, 70 (tests/test_claims.py ROLES)
DIVERGED = "diverged: loss nan at epoch 3"


@pytest.mark.parametrize(
    "role, top1, failure, claim, verdict, measured",
    [
        # reference − v1 head: -2, -2, -1: mean -1.67, std 0.577, half 1.43: CI [-3.1, -0.2] below 0
        ("v1_head", [62.0, 52.0, 71.0], None, "mlp head", CONTRADICTED, "Δ -1.7 ± 1.4 (n=3)"),
        # 2, -1, 1: mean 0.67, std 1.528, half 4.303 x 1.528 / sqrt 3 = 3.80: CI [-3.1, +4.5] includes 0
        ("v1_head", [58.0, 51.0, 69.0], None, "mlp head", INCONCLUSIVE, "Δ +0.7 ± 3.8 (n=3)"),
        # helps on the seeds that ran, but one diverged: counted, never taken as a loss or dropped
        ("v1_head", [55.0, 5.0, 64.0], [None, DIVERGED, None], "mlp head", INCONCLUSIVE, "1 of 3 seeds failed"),
        ("no_blur", [62.0, 52.0, 71.0], None, "aug plus", CONTRADICTED, "Δ -1.7 ± 1.4 (n=3)"),
        ("no_blur", [58.0, 51.0, 69.0], None, "aug plus", INCONCLUSIVE, "Δ +0.7 ± 3.8 (n=3)"),
    ],
)
def test_the_v2_steps_judged_on_the_probe(tmp_path, role, top1, failure, claim, verdict, measured):
    full_results(tmp_path, **{role: (top1, failure, {})})
    write_claims(tmp_path, CONFIG)
    got, row = verdicts(tmp_path), rows_by_claim(tmp_path)[claim]
    assert row["verdict"] == verdict and measured in row["measured"]
    # the other step still holds: the two claims read different cells
    assert got["aug plus" if claim == "mlp head" else "mlp head"] == HOLDS


# --- the patch projection: the largest kNN dip, learned − frozen --------------------------------
def test_the_largest_knn_drop_from_a_log(tmp_path):
    log = tmp_path / "cells" / "c" / "pretrain" / "log.csv"
    log.parent.mkdir(parents=True)
    # consecutive checks 30 -> 25.5 (4.5 down), -> 27 (up), -> 20.25 (6.75 down); the row without a
    # check (epoch 2) is skipped, the rows are read in epoch order
    log.write_text("epoch,loss,knn\n1,7.0,30.0\n3,6.0,25.5\n2,6.5,\n5,5.0,20.25\n4,5.5,27.0\n")
    assert largest_knn_drop(tmp_path, "c") == 6.75
    log.write_text("epoch,loss,knn\n1,7.0,10\n2,6.0,12\n3,5.0,15\n")
    assert largest_knn_drop(tmp_path, "c") == 0.0  # never drops
    log.write_text("epoch,loss,knn\n1,7.0,\n2,6.0,12\n")
    assert largest_knn_drop(tmp_path, "c") is None  # one check: no drop to measure
    log.write_text("epoch,loss\n1,7.0\n2,6.0\n")
    assert largest_knn_drop(tmp_path, "c") is None  # no monitor
    assert largest_knn_drop(tmp_path, "nowhere") is None


def vit_run(root, role: str, seed: int, top1: float, knn: list[float], failure: str | None = None):
    """A ViT run of ``role``: its probe and a log with the kNN monitor every epoch (a failed
    run's loss not finite at its last epoch)."""
    cid = VIT_IDS[role] + (f",seed={seed}" if seed else "")
    cell(root, cid, top1, failure)
    rows = [f"{e},{'nan' if failure and e == len(knn) else 8.0 - e},{k}" for e, k in enumerate(knn, 1)]
    (root / "cells" / cid / "pretrain" / "log.csv").write_text("\n".join(["epoch,loss,knn", *rows]) + "\n")


# seeds 0-2: each run's kNN per epoch and its largest drop (by hand)
DIPPING = [[20, 30, 22, 35], [25, 31, 24, 33], [18, 28, 19, 27, 20]]  # 8, 7, 9 (28 -> 19; 27 -> 20 is 7)
STEADY = [[20, 26, 31, 35], [22, 28, 27, 33], [19, 25, 30, 29.5]]  # 0, 1, 0.5
# Δ DIPPING − STEADY: 8, 6, 8.5: mean 7.5, std sqrt(1.75) = 1.323, half 4.303 x 1.323 / sqrt 3 = 3.29
SLIGHT = [[20, 25, 24, 30], [21, 26, 27, 31], [20, 24, 23, 29]]  # 1, 0, 1
EVEN = [[20, 25, 26, 30], [21, 26, 25.5, 31], [20, 24, 25, 29]]  # 0, 0.5, 0
# Δ SLIGHT − EVEN: 1, -0.5, 1: mean 0.5, std 0.866, half 4.303 x 0.866 / sqrt 3 = 2.15: includes 0
FROZEN_TOP1, LEARNED_TOP1 = [50.0, 45.0, 55.0], {"_high": [44.0, 40.0, 50.0], "": [49.0, 45.0, 54.0]}


def vit_results(root, learned_high=DIPPING, frozen_high=STEADY, learned=SLIGHT, frozen=EVEN, failed=None):
    """The four ViT roles at seeds 0-2; ``failed``: (role, seed) whose run diverged."""
    logs = {"vit_learned_high": learned_high, "vit_frozen_high": frozen_high, "vit_learned": learned}
    for role, runs in {**logs, "vit_frozen": frozen}.items():
        top1 = LEARNED_TOP1["_high" if role.endswith("_high") else ""] if "learned" in role else FROZEN_TOP1
        for s, knn in enumerate(runs):
            failure = "diverged: loss nan at epoch 4" if failed == (role, s) else None
            vit_run(root, role, s, top1[s], knn, failure)


def test_a_learned_projection_dipping_at_the_larger_lr_holds_the_claim(tmp_path):
    vit_results(tmp_path)
    write_claims(tmp_path, VIT)
    row = rows_by_claim(tmp_path)["patch projection"]
    # decided at 4 x the lr alone: at the recipe's lr the Δ includes 0 and the verdict still holds
    assert row["verdict"] == HOLDS
    assert row["measured"].startswith("kNN drop learned − frozen at lr 0.0006: Δ +7.5 ± 3.3 (n=3)")
    assert "kNN drop learned − frozen at lr 0.00015: Δ +0.5 ± 2.2 (n=3)" in row["measured"]
    # probe frozen − learned: 6, 5, 5 (mean 5.33, std 0.577, half 1.43); 1, 0, 1 (0.67 ± 1.43)
    assert "probe frozen − learned at lr 0.0006: Δ +5.3 ± 1.4 (n=3)" in row["measured"]
    assert "probe frozen − learned at lr 0.00015: Δ +0.7 ± 1.4 (n=3)" in row["measured"]
    assert "the largest drop of the kNN monitor between consecutive epochs" in row["needs"]


def test_a_frozen_projection_dipping_more_contradicts_it(tmp_path):
    vit_results(tmp_path, learned_high=STEADY, frozen_high=DIPPING)
    write_claims(tmp_path, VIT)
    row = rows_by_claim(tmp_path)["patch projection"]
    assert row["verdict"] == CONTRADICTED and "at lr 0.0006: Δ -7.5 ± 3.3 (n=3)" in row["measured"]


def test_dips_only_at_the_recipes_lr_leave_it_inconclusive(tmp_path):
    """At 4 x the lr Δ 1, -0.5, 1 (CI includes 0); at the recipe's lr +7.5 ± 3.3, reported only."""
    vit_results(tmp_path, learned_high=SLIGHT, frozen_high=EVEN, learned=DIPPING, frozen=STEADY)
    write_claims(tmp_path, VIT)
    row = rows_by_claim(tmp_path)["patch projection"]
    assert row["verdict"] == INCONCLUSIVE and row["smallest detectable Δ"] == "±2.2 at n = 3"


def test_a_diverged_vit_run_is_a_failed_run_not_a_drop(tmp_path):
    # the learned projection at 4 x the lr diverged at seed 2; its log's checks 28 -> 0 would be a
    # drop of 28 points, the largest of all: it is counted as failed, and decides nothing
    diverged = [DIPPING[0], DIPPING[1], [18, 28, 0.0, 0.0]]
    vit_results(tmp_path, learned_high=diverged, failed=("vit_learned_high", 2))
    write_claims(tmp_path, VIT)
    row = rows_by_claim(tmp_path)["patch projection"]
    # seeds 0, 1 pair: Δ 8, 6: mean 7, std 1.414, half 12.706 x 1.414 / sqrt 2 = 12.7
    assert row["verdict"] == INCONCLUSIVE
    assert row["measured"].startswith(
        "kNN drop learned − frozen at lr 0.0006: Δ +7.0 ± 12.7 (n=2), 1 of 3 seeds failed;"
    )


def test_the_patch_projection_is_not_run_until_its_cells_ran(tmp_path):
    write_claims(tmp_path, VIT)
    row = rows_by_claim(tmp_path)["patch projection"]
    assert row["verdict"] == NOT_RUN
    assert "at its recipe's lr 0.00015 and at 4 x it" in row["claim"] and "vit_tiny" in row["claim"]


def test_the_claims_cells_of_a_vit_grid_are_counted():
    """CLAIMS at 15 epochs on 50,000 images: the 4 ViT roles x 3 seeds beside the others."""
    without, with_vit = (len(claims_cells(load_config(c))) for c in (CONFIG, VIT))
    assert with_vit - without == 4 * CLAIMS["seeds"]
