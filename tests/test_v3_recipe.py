"""MoCo v3's recipe: a cell that switches to v3 (the base cell, a grid cell, or one given whole)
takes its paper's rule for its backbone, never MoCo v2's lr; a v3 cell left at an SGD recipe's
lr under LARS or AdamW is refused, named; the methods table sets each backbone against its own
random init. Expected values are the paper's rule computed by hand (moco-v3 CONFIG.md)."""

import pytest
from test_tables import fake_cell

from pipeline.dag.config import DEFAULT_CONFIG, ConfigError, load_config, load_stage_config, load_yaml, merge
from pipeline.dag.grid import grid_cells, group_id
from pipeline.tables import run as write_tables

VIT = {"backbone": "vit_tiny", "patch_size": 8, "depth": 4}
VIT_ID = "variant=v3,backbone=vit_tiny,patch_size=8,depth=4"
RANDOM_VIT_ID = "method=random,backbone=vit_tiny,patch_size=8,depth=4"
RECIPE_KEYS = ("optimizer", "lr", "weight_decay", "warmup_epochs", "T", "aug", "mlp_dim")


def demo(**over) -> dict:
    return merge(load_yaml(DEFAULT_CONFIG), over)


def recipe_of(p) -> dict:
    return {k: getattr(p, k) for k in RECIPE_KEYS}


# ResNet: LARS, 0.6 x 64 / 256 = 0.15, weight decay 1e-6, 10 of 100 epochs warmup (1.3 of 13), T 1.0;
# ViT: AdamW, 1.5e-4 x 64 / 256 = 3.75e-5, weight decay 0.1, 40 of 300 epochs warmup (1.73 of 13), T 0.2
RESNET_RULE = {"optimizer": "lars", "lr": 0.15, "weight_decay": 1e-6, "warmup_epochs": 1.3, "T": 1.0}
VIT_RULE = {"optimizer": "adamw", "lr": 3.75e-5, "weight_decay": 0.1, "warmup_epochs": 1.73, "T": 0.2}
SMALL_HEADS = {"aug": "v3", "mlp_dim": 256}


# over the rule, the embedded data's (config.yaml's grid.v3_resnet and grid.v3_vit: the recipe study's choice)
EMBEDDED = {"resnet": {"lars_trust": 0.02}, "vit": {"lr": 1e-3}}
NO_EMBEDDED = {"v3_resnet": {"lars_trust": None}, "v3_vit": {"lr": None}}


@pytest.mark.parametrize(
    "pretrain, rule, embedded",
    [({"variant": "v3"}, RESNET_RULE, EMBEDDED["resnet"]), ({"variant": "v3", **VIT}, VIT_RULE, EMBEDDED["vit"])],
)
def test_a_newcomers_v3_base_cell_takes_v3s_recipe(pretrain, rule, embedded):
    stated = demo(pretrain=pretrain)
    cfg = load_config(stated)
    trained = {**recipe_of(cfg.pretrain), "lars_trust": cfg.pretrain.lars_trust}
    assert trained == pytest.approx({**rule, **SMALL_HEADS, "lars_trust": 0.001, **embedded})
    assert stated["pretrain"]["lr"] == pytest.approx(trained["lr"])  # the jobs' JSON holds what they train
    # without the embedded data's recipe: the paper's rule alone
    ruled = load_config(demo(pretrain=pretrain, grid=NO_EMBEDDED)).pretrain
    assert {**recipe_of(ruled), "lars_trust": ruled.lars_trust} == pytest.approx(
        {**rule, **SMALL_HEADS, "lars_trust": 0.001}
    )


def test_a_v3_cells_own_values_stay_over_its_recipe():
    cfg = load_config(demo(pretrain={"variant": "v3", "lr": 0.3, "lars_trust": 0.02}))
    assert cfg.pretrain.lr == 0.3 and cfg.pretrain.lars_trust == 0.02 and cfg.pretrain.optimizer == "lars"


def test_a_paper_preset_keeps_what_it_states():
    """The ViT-S preset states the paper's 4096-wide heads (config.yaml's default too): kept."""
    presets = DEFAULT_CONFIG.parent / "presets"
    cfg = load_config(
        merge(load_yaml(presets / "imagenet-mocov2.yaml"), load_yaml(presets / "imagenet-mocov3-vit.yaml"))
    )
    assert recipe_of(cfg.pretrain) == {**VIT_RULE, "lr": 0.0024, "warmup_epochs": 40, "aug": "v3", "mlp_dim": 4096}


def test_the_demo_base_cell_is_unchanged():
    cfg = load_config(demo())
    assert (cfg.pretrain.lr, cfg.pretrain.optimizer, cfg.pretrain.aug, cfg.pretrain.T) == (0.015, "auto", "v2", 0.2)


def test_grid_cells_given_whole_take_their_recipe_under_their_ids():
    cells = grid_cells(load_config(demo(grid={"only": None, "seeds": 1, **NO_EMBEDDED})))
    assert recipe_of(cells["variant=v3"].pretrain) == pytest.approx({**RESNET_RULE, **SMALL_HEADS})
    vit = cells[VIT_ID].pretrain
    assert recipe_of(vit) == pytest.approx({**VIT_RULE, **SMALL_HEADS})
    assert (vit.patch_size, vit.depth) == (8, 4)
    random_vit = cells[RANDOM_VIT_ID].pretrain
    assert (random_vit.method, random_vit.backbone) == ("random", "vit_tiny")
    # the demo (grid.only) runs none of them
    assert not {"variant=v3", VIT_ID, RANDOM_VIT_ID} & set(grid_cells(load_config(demo())))


@pytest.mark.parametrize(
    "pretrain, optimizer",
    [
        ({"variant": "v3", "lr": 0.015}, "lars"),  # MoCo v2's lr under v3's LARS: 0.06 per 256 images
        ({"variant": "v3", **VIT, "lr": 0.015}, "adamw"),  # the newcomer: AdamW at 0.015
        ({"variant": "v3", "optimizer": "lars", "lr": 0.015, "batch_size": 64}, "lars"),
    ],
)
def test_a_v3_stage_at_an_sgd_lr_under_lars_or_adamw_is_refused_named(pretrain, optimizer):
    with pytest.raises(ConfigError, match=rf"variant v3 under {optimizer} .* at pretrain\.lr=0\.015 does not learn"):
        load_stage_config({"pretrain": pretrain}, ["pretrain"])


def test_v3_under_sgd_or_at_its_rule_is_accepted():
    load_stage_config({"pretrain": {"variant": "v3", "optimizer": "sgd", "lr": 0.015}}, ["pretrain"])
    load_stage_config({"pretrain": {"variant": "v3", "optimizer": "lars", "lr": 0.15}}, ["pretrain"])
    load_stage_config({"pretrain": {"variant": "v3", **VIT, "lr": 1e-3}}, ["pretrain"])


def test_each_backbone_is_set_against_its_own_random_init(tmp_path):
    """Seeds 0 and 1 of MoCo v2, v3 on ResNet-18, v3 on the ViT and random init of each backbone:
    the ViT's Δ is its linear top-1 minus the random ViT's on the same seed (70 − 45, 72 − 47:
    +25 both), the ResNet rows' minus the random ResNet's (v3: 50 − 30, 54 − 32: +21 ± 12.706 x
    1.414 / sqrt 2 = 12.7); the figure names each tick's backbone."""
    from pipeline.report import figures
    from pipeline.report.studies import collect, groups

    top1 = {"base": (60, 62), "variant=v3": (50, 54), VIT_ID: (70, 72), "method=random": (30, 32)}
    top1[RANDOM_VIT_ID] = (45, 47)
    for cid, values in top1.items():
        for seed, value in enumerate(values):
            fake_cell(tmp_path, cid if not seed else ("seed=1" if cid == "base" else f"{cid},seed=1"), float(value))
    write_tables(tmp_path, {"grid": {"seeds": 2}}, figures=False)
    by_backbone = {(label, cells[1]): cells[-1] for label, cells in _rows(tmp_path)}
    assert by_backbone[("MoCo", "ViT-Ti/8 (4 blocks)")] == "+25.0 ± 0.0 (n=2)"
    assert by_backbone[("MoCo", "ResNet-18 (width 16)")] == "+21.0 ± 12.7 (n=2)"
    assert by_backbone[("random init", "ViT-Ti/8 (4 blocks)")] == "reference"
    assert by_backbone[("random init", "ResNet-18 (width 16)")] == "reference"
    assert "each row against random init of its own backbone" in (tmp_path / "tables" / "methods.md").read_text()
    ticks = [t.get_text() for t in figures.methods(groups(collect(tmp_path))).axes[0].get_xticklabels()]
    assert "MoCo v3\nViT-Ti/8 (4 blocks)" in ticks and "random init\nViT-Ti/8 (4 blocks)" in ticks


def _rows(results):
    """(label, cells) of each row of methods.md, rows of one label kept apart."""
    lines = (results / "tables" / "methods.md").read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("| ") and not line.startswith("| method") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            out.append((cells[0], cells[1:]))
    return out


def test_the_methods_preset_runs_every_method_and_each_backbones_random_init_at_5_seeds():
    """presets/methods.yaml: MoCo v2, v3 on both backbones, the rivals, supervised and random init
    of each backbone, 5 seeds each (8 x 5 = 40 cells), each a cell of the grid, no detection."""
    cfg = load_config(demo(**load_yaml(DEFAULT_CONFIG.parent / "presets" / "methods.yaml")))
    cells = grid_cells(cfg)
    groups = {"base", "variant=v3", VIT_ID, RANDOM_VIT_ID, "method=random", "method=supervised"}
    groups |= {"method=simclr", "method=byol"}
    assert len(cells) == 40 and cfg.grid.seeds == 5 and not cfg.detect.enabled
    assert {group_id(cid) for cid in cells} == groups
    assert cells[f"{VIT_ID},seed=4"].pretrain.lr == pytest.approx(1e-3)  # the ViT's embedded recipe


def test_a_symmetric_base_cell_leaves_the_v3_cells_buildable():
    """pretrain symmetric: true (MoCo v1/v2's two-way loss) on the embedded config: the grid's v3
    cells take v3's recipe, whose loss is symmetric already, instead of refusing the whole grid;
    a v3 cell that states symmetric itself is still refused."""
    grid_cells(load_config(demo(pretrain={"symmetric": True})))  # the demo's DAG builds (it refused before)
    cells = grid_cells(load_config(demo(pretrain={"symmetric": True}, grid={"only": None})))
    assert cells["base"].pretrain.symmetric is True
    assert cells["variant=v3"].pretrain.symmetric is False
    with pytest.raises(ConfigError, match="symmetric applies to MoCo v1/v2's queue"):
        load_config(demo(pretrain={"variant": "v3", "symmetric": True}))
