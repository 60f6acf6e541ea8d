"""Grid expansion: readable ids, one-at-a-time and product designs, duplicates merged."""

import re
from dataclasses import replace

import pytest

from pipeline.dag.claims_plan import not_trained as not_trained_claims
from pipeline.dag.config import ConfigError, load_config, section, to_dict
from pipeline.dag.grid import (
    cell_id,
    cell_resources,
    claims_budget,
    claims_cells,
    claims_overrides,
    grid_cells,
    group_id,
    parse_cell_id,
)
from pipeline.dag.sections import Resources
from pipeline.plan import merged_config

BASE = {
    "method": "moco",
    "variant": "v2",
    "backbone": "resnet18",
    "K": 4096,
    "m": 0.99,
    "T": 0.2,
    "epochs": 10,
    "batch_size": 256,
    "lr": 0.06,
}


def grid(**g):
    return load_config({"pretrain": dict(BASE), "grid": g})


def test_one_at_a_time():
    cells = grid_cells(grid(one_at_a_time={"K": [1024, 4096], "m": [0.9, 0.999]}))
    assert set(cells) == {"base", "K=1024", "m=0.9", "m=0.999"}  # K=4096 is the base itself
    assert cells["K=1024"].pretrain.K == 1024 and cells["K=1024"].pretrain.m == 0.99


def test_product_and_merge_with_one_at_a_time():
    cells = grid_cells(grid(one_at_a_time={"K": [1024]}, product={"K": [1024, 2048], "m": [0.9, 0.99]}))
    assert set(cells) == {"base", "K=1024", "K=1024,m=0.9", "K=2048", "K=2048,m=0.9"}


def test_baselines_are_cells():
    cells = grid_cells(grid(baselines=["random", "supervised"]))
    assert set(cells) == {"base", "method=random", "method=supervised"}


def test_seeds_replicate_every_cell():
    cells = grid_cells(grid(one_at_a_time={"K": [1024]}, baselines=["random"], seeds=3))
    assert set(cells) == {
        "base",
        "seed=1",
        "seed=2",
        "K=1024",
        "K=1024,seed=1",
        "K=1024,seed=2",
        "method=random",
        "method=random,seed=1",
        "method=random,seed=2",
    }
    assert cells["K=1024,seed=2"].stated(BASE) == {**BASE, "K": 1024, "seed": 2}
    assert {group_id(c) for c in cells} == {"base", "K=1024", "method=random"}  # one table row each
    assert set(grid_cells(grid(seeds=1))) == {"base"}


def test_id_round_trip():
    params = {**BASE, "K": 1024, "m": 1e-05}
    cid = cell_id(BASE, params)
    assert cid == "K=1024,m=1e-05"
    assert parse_cell_id(cid) == {"K": 1024, "m": 1e-05}


def test_impossible_cell_rejected_at_expansion():
    with pytest.raises(ConfigError, match="cell 'K=1000'.*multiple"):
        grid_cells(grid(one_at_a_time={"K": [1000]}))
    with pytest.raises(ConfigError, match="cell 'm=1.5'.*pretrain.m"):
        grid_cells(grid(one_at_a_time={"m": [1.5]}))


def test_only_names_a_cell_the_grid_lacks_and_the_cells_it_has():
    assert set(grid_cells(grid(one_at_a_time={"K": [1024]}, only=["K=1024"]))) == {"K=1024"}
    with pytest.raises(ConfigError, match=r"grid.only: \['K=999'\] not in the grid \(its cells: base, K=1024\)"):
        grid_cells(grid(one_at_a_time={"K": [1024]}, only=["K=999"]))


@pytest.mark.parametrize("other", [{"mechanism": "end_to_end"}, {"method": "simclr"}, {"variant": "v3", "lr": 0.15}])
def test_claims_need_a_base_cell_with_a_queue(other):
    """The claims vary K and m of MoCo v1/v2's queue: any other base cell is refused, named."""
    cfg = load_config({"pretrain": {**BASE, **other}, "claims": {}})
    with pytest.raises(ConfigError, match=r"claims: the claims vary the queue .* \(pretrain\) is method="):
        claims_cells(cfg)


def test_unknown_axis():
    with pytest.raises(ConfigError, match="unknown axis"):
        parse_cell_id("Q=3")


def test_all_designs_together_and_duplicates_merge():
    cells = grid_cells(
        grid(
            one_at_a_time={"K": [1024, 4096], "m": [0.9]},
            product={"K": [1024, 4096], "m": [0.9, 0.99]},  # K=4096,m=0.99 is the base
            baselines=["random"],
        )
    )
    assert sorted(cells) == sorted(["base", "K=1024", "m=0.9", "K=1024,m=0.9", "method=random"])
    assert cells["K=1024,m=0.9"].stated(BASE) == {**BASE, "K": 1024, "m": 0.9}


def test_product_size():
    cells = grid_cells(
        grid(
            product={
                "K": [256, 512, 1024, 2048, 4096],
                "m": [0.9, 0.99, 0.999, 0.9999, 0.5],
                "T": [0.07, 0.1, 0.2, 0.5],
            }
        )
    )
    assert len(cells) == 5 * 5 * 4 and "base" in cells and "K=256,m=0.5,T=0.07" in cells


def test_memory_bank_needs_a_larger_dataset():
    def cfg(train_per_class):
        return load_config(
            {
                "pretrain": dict(BASE),
                "grid": {"one_at_a_time": {"mechanism": ["memory_bank"]}},
                "dataset": {"source": "synthetic", "synthetic": {"train_per_class": train_per_class}},
            }
        )

    with pytest.raises(
        ConfigError, match="cell 'mechanism=memory_bank' is impossible.*memory bank K=4096.*1000 images"
    ):
        grid_cells(cfg(100))  # 1000 images < K=4096
    assert "mechanism=memory_bank" in grid_cells(cfg(500))


@pytest.mark.integration
def test_impossible_cell_named_at_dag_build(tmp_path):
    from conftest import run, snakemake_cli

    bad = tmp_path / "bad.yaml"
    bad.write_text("grid:\n  one_at_a_time: {K: [100]}\n  product: {}\n  baselines: []\n")
    proc = run(
        [
            *snakemake_cli(),
            "-n",
            "--configfile",
            "workflow/config/presets/tiny.yaml",
            str(bad),
            "--config",
            f"results={tmp_path}",
        ],
        check=False,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "ablation cell 'K=100' is impossible" in out and "not a multiple of the global batch size 64" in out


def test_group_id_drops_the_seed():
    assert group_id("seed=1") == "base" and group_id("K=1024,seed=3") == "K=1024" and group_id("m=0.9") == "m=0.9"


def test_cell_resources_scale_with_the_cell():
    spec = Resources(minutes_per_epoch=2, overhead_minutes=10, nodes=1, batch_per_node=512)

    def cell(**changes):
        return section("pretrain", {**BASE, **changes})

    assert cell_resources(cell(), spec) == {"runtime": 10 + 2 * 10, "nodes": 1}
    assert cell_resources(cell(epochs=20), spec)["runtime"] == 10 + 2 * 20
    assert cell_resources(cell(backbone="resnet50"), spec)["runtime"] == 10 + 2 * 10 * 2.5
    assert cell_resources(cell(batch_size=2048), spec) == {"runtime": 10 + 2 * 10 // 4, "nodes": 4}
    assert cell_resources(cell(method="random"), spec) == {"runtime": 10, "nodes": 1}
    assert cell_resources(cell(), Resources())["nodes"] == 1  # defaults


@pytest.mark.integration
def test_dag_of_a_100_cell_product_grid(tmp_path):
    """Dry run of a 5 x 5 x 4 product grid (100 cells): builds the whole DAG. How long it takes
    is measured, not asserted: `python -m pipeline.bench dag` (a 100-cell grid too)."""
    from conftest import run, snakemake_cli
    from test_workflow import jobs_planned

    overlay = tmp_path / "grid100.yaml"
    # shuffle_bn: [true] is the base value: it cancels the config's one-at-a-time shuffle_bn cell
    overlay.write_text(
        "grid:\n  one_at_a_time: {shuffle_bn: [true]}\n  baselines: []\n  product:\n"
        "    K: [64, 128, 256, 512, 1024]\n    m: [0, 0.9, 0.99, 0.999, 0.9999]\n"
        "    T: [0.07, 0.1, 0.2, 0.5]\n"
    )
    proc = run(
        [
            *snakemake_cli(),
            "-n",
            "--quiet",
            "rules",
            "--configfile",
            "workflow/config/presets/tiny.yaml",
            str(overlay),
            "--config",
            f"results={tmp_path / 'results'}",
        ],
        timeout=300,
    )
    counts = jobs_planned(proc.stdout)
    assert counts["pretrain"] == counts["probe"] == counts["detect"] == 100 and counts["tables"] == 1


def test_a_cluster_jobs_target_keeps_its_cell_id():
    """A cluster job names its one job with --target-jobs; Snakemake's parser splits the cell id
    at its commas: rejoined, every job is the one the executor encoded."""
    from snakemake.target_jobs import parse_target_jobs_cli_args
    from snakemake_interface_executor_plugins.utils import TargetSpec, encode_target_jobs_cli_args

    from pipeline.dag.target_jobs import rejoin_target_wildcards

    sent = [
        TargetSpec("detect", {"cell": "K=128,m=0.9,seed=1", "trial": "0"}),
        TargetSpec("pretrain", {"cell": "K=128,seed=2"}),
        TargetSpec("probe", {"cell": "base"}),
        TargetSpec("tables", {}),
    ]
    received = parse_target_jobs_cli_args(encode_target_jobs_cli_args(sent))
    wildcards = {"detect": ["cell", "trial"], "pretrain": ["cell"], "probe": ["cell"], "tables": []}
    assert rejoin_target_wildcards(received, wildcards.__getitem__) == sent


def test_the_repair_wraps_snakemakes_dag_once():
    """The Snakefile installs the repair each time it is read: always around Snakemake's own."""
    import snakemake.api  # noqa: F401  (snakemake.dag alone is a circular import)
    from snakemake import dag

    from pipeline.dag.target_jobs import rejoin_cells_in_cluster_jobs

    rejoin_cells_in_cluster_jobs()
    own = dag.DAG.__init__.wrapped
    rejoin_cells_in_cluster_jobs()
    assert dag.DAG.__init__.wrapped is own and own.__module__ == "snakemake.dag"


@pytest.mark.parametrize(
    "version, init, why",
    [
        ("10.0.0", None, "version 10.0.0, not 9.x"),
        ("9.27.1", lambda self, settings, workflow: None, "does not take the workflow first"),
    ],
)
def test_the_repair_refuses_a_snakemake_it_does_not_fit(version, init, why):
    """A Snakemake where the repair would not take hold fails the DAG build, loudly."""
    from snakemake import dag
    from snakemake.settings.types import DAGSettings

    from pipeline.dag.target_jobs import check_snakemake

    check_snakemake("9.27.1", getattr(dag.DAG.__init__, "wrapped", dag.DAG.__init__), DAGSettings)  # this one fits
    with pytest.raises(RuntimeError, match=f"cannot repair.*{re.escape(why)}.*would run another cell"):
        check_snakemake(version, init or getattr(dag.DAG.__init__, "wrapped", dag.DAG.__init__), DAGSettings)


# --- the claims study's plan on real datasets --------------------------------------------------
@pytest.mark.parametrize(
    "preset, trained, not_trained",
    [
        # ImageNet-1k (dataset.train_images 1,281,167) at batch 256: 5,004 steps/epoch x 100 = 500,400
        # steps; K <= 128,116 (10 %): every claim is decidable, every cell trained (11 MoCo groups, the
        # MoCo v2 report's 2 steps: v1's head, no blur, and the rivals' 7: SimCLR at 256, with a
        # quarter of its negatives and at 1,024, BYOL, without its predictor under SGD and LARS,
        # without the EMA; its grid.cells has no ViT)
        ("imagenet-mocov2.yaml", 11 + 2 + 7, set()),
        # CIFAR-10 (known: 50,000) at batch 512: 97 steps/epoch x 100 = 9,700 steps; the preset's
        # m has no 0.9999 (34,656 steps): "too slow" is not decidable and nothing is trained for it
        ("cifar10.yaml", 9 + 7, {"slow_m"}),
    ],
)
def test_claims_plan_every_cell_at_the_claims_seeds(tmp_path, preset, trained, not_trained):
    cfg = merged_config([f"workflow/config/presets/{preset}"], [f"results={tmp_path}"])  # no conversion report
    typed = load_config(cfg)
    cells = claims_cells(typed)
    base, claims = to_dict(typed.pretrain), typed.claims
    seeds = {}
    for cid in cells:
        seeds.setdefault(group_id(cid), []).append(cells[cid].pretrain.seed)
    roles = claims_overrides(claims, typed.pretrain)
    ids = {role: group_id(cell_id(base, {**base, **o})) for role, o in roles.items()}
    # every m, K x FIFO cell, the memory bank and the long run: claims.seeds (3) each, paired
    rivals = ("simclr", "simclr_few", "simclr_large", "byol", "byol_no_predictor", "byol_no_predictor_lars")
    rivals += ("byol_no_ema",)
    steps = ("v1_head", "no_blur")  # the MoCo v2 report's (none for cifar10.yaml's v1 base without blur)
    compared = [
        r for r in roles if r.startswith(("m=", "K=")) or r in ("memory_bank", "long", "reference", *steps, *rivals)
    ]
    assert {ids[r] for r in compared} == {g for g in seeds if g != "method=random"}
    # the reference's group (the base's m and K, FIFO: the same cell) also at the 3 pilot seeds
    # 3-5; random replacement (only the FIFO bound needs it) at claims.invariant_seeds (2)
    expected = {
        r: [0, 1, 2, 3, 4, 5] if ids[r] == ids["reference"] else [0, 1] if r.endswith(",random") else [0, 1, 2]
        for r in compared
    }
    assert {r: sorted(seeds[ids[r]]) for r in compared} == expected
    assert sorted(seeds["method=random"]) == [0, 1, 2, 3, 4, 5]  # random init, and at the pilot seeds
    assert len(seeds) - 1 == trained  # trained groups (random init trains nothing)
    assert set(not_trained_claims(claims, claims_budget(typed))) == not_trained
    # claims.only trains the rivals' rows alone: nothing is said of a claim they leave out
    rivals_only = replace(claims, only=("large_batch", "byol_learns"))
    assert not_trained_claims(rivals_only, claims_budget(typed)) == {}


def test_a_confirmatory_claims_run_uses_only_fresh_seeds(tmp_path):
    """claims.first_seed 10: the compared cells at seeds 10-12, the pilot at 13-15; no cell at
    the base's seeds 0-2, whose runs an earlier study may have seen."""
    overrides = [f"results={tmp_path}", "claims={first_seed: 10}"]
    typed = load_config(merged_config(["workflow/config/presets/cifar10.yaml"], overrides))
    seeds = {}
    for cid, cell in claims_cells(typed).items():
        seeds.setdefault(group_id(cid), set()).add(cell.pretrain.seed)
    ids = {
        role: group_id(cell_id(to_dict(typed.pretrain), {**to_dict(typed.pretrain), **o}))
        for role, o in claims_overrides(typed.claims, typed.pretrain).items()
    }
    assert seeds[ids["reference"]] == seeds["method=random"] == {10, 11, 12, 13, 14, 15}
    assert seeds[ids["long"]] == seeds[ids["memory_bank"]] == {10, 11, 12}
    assert set().union(*seeds.values()) == set(range(10, 16))


def test_claims_only_trains_the_named_claims_cells_and_no_other(tmp_path):
    """claims.only [large_batch, byol_predictor]: SimCLR with all its negatives and with a quarter,
    the reference and random init at the pilot seeds (large_batch's gate), BYOL without its
    predictor and random init; no m, K, memory-bank, long, large-batch or other BYOL cell."""
    overrides = [f"results={tmp_path}", "claims={only: [large_batch, byol_predictor]}"]
    typed = load_config(merged_config(["workflow/config/presets/cifar10.yaml"], overrides))
    roles = claims_overrides(typed.claims, typed.pretrain)
    base = to_dict(typed.pretrain)
    ids = {role: group_id(cell_id(base, {**base, **o})) for role, o in roles.items()}
    seeds = {}
    for cid, cell in claims_cells(typed).items():
        seeds.setdefault(group_id(cid), set()).add(cell.pretrain.seed)
    trained = {ids[r] for r in ("simclr", "simclr_few", "byol_no_predictor", "pilot")} | {"method=random"}
    assert set(seeds) == trained
    assert seeds[ids["simclr"]] == seeds[ids["simclr_few"]] == seeds[ids["byol_no_predictor"]] == {0, 1, 2}
    assert seeds[ids["pilot"]] == {3, 4, 5}  # the pilot seeds only: the reference itself is not compared
    assert seeds["method=random"] == {0, 1, 2, 3, 4, 5}


def test_claims_only_refuses_a_claim_it_does_not_know(tmp_path):
    with pytest.raises(Exception, match="byol_learn"):
        load_config(merged_config([], [f"results={tmp_path}", "claims={only: [byol_learn]}"]))


def test_a_folder_dataset_without_its_size_fails_the_claims_plan(tmp_path):
    cfg = merged_config(["workflow/config/presets/imagenet-mocov2.yaml"], [f"results={tmp_path}"])
    cfg["dataset"]["train_images"] = None
    with pytest.raises(ConfigError, match="dataset.train_images"):
        claims_cells(load_config(cfg))
