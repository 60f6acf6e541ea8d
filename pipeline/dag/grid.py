"""The ablation grid: a base cell plus sweeps, expanded to cells with stable, readable ids.

A cell id lists only the parameters that differ from the base, in a fixed axis order, e.g.
``base``, ``K=1024``, ``K=1024,m=0.9`` or ``method=random``. Identical cells reached from
different sweeps get the same id, so they are one job.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from pipeline.base.layout import AXES, QUEUE_POLICIES, is_resnet
from pipeline.dag.claims_plan import LARGE_BATCH, LARGE_LR_FACTOR, Budget, fewer_negatives, role_seeds, vit_cell
from pipeline.dag.config import ConfigError, merge, pretrain_cell, to_dict
from pipeline.dag.recipes import with_recipe
from pipeline.dag.sections import Claims, Config, Detect, Grid, Resources
from pipeline.dag.training_set import synthetic_images, training_set
from pipeline.methods import method_spec
from pipeline.methods.section import Pretrain

BASE_ID = "base"


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: its pretrain section, typed and validated, and what it sets over
    the base cell (its override, its method's recipe included: grid.supervised, ...)."""

    pretrain: Pretrain
    override: dict

    def stated(self, base: dict) -> dict:
        """The cell as the config states it: the config's own pretrain keys (``base``, as
        given) with the override. What the job's JSON holds, and the tables' expected cells."""
        return merge(base, self.override)


def format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def cell_id(base: dict, params: dict) -> str:
    diffs = [
        f"{axis}={format_value(params[axis])}" for axis in AXES if axis in params and params[axis] != base.get(axis)
    ]
    return ",".join(diffs) or BASE_ID


def parse_cell_id(text: str) -> dict:
    """``K=4096,m=0.99`` -> {"K": 4096, "m": 0.99}; ``base`` -> {}."""
    text = str(text).strip()
    if text in ("", BASE_ID):
        return {}
    out = {}
    for part in text.split(","):
        if "=" not in part:
            raise ConfigError(f"cell '{text}': expected axis=value pairs separated by ',' ")
        axis, value = part.split("=", 1)
        if axis not in AXES:
            raise ConfigError(f"cell '{text}': unknown axis '{axis}' (axes: {', '.join(AXES)})")
        out[axis] = parse_value(value)
    return out


def parse_value(text: str):
    """Inverse of format_value (YAML alone reads '1e-05' as a string)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def _sweep_overrides(grid: Grid) -> list[dict]:
    overrides: list[dict] = [{}]
    for axis, values in grid.one_at_a_time.items():
        overrides += [{axis: v} for v in values]
    if grid.product:
        axes = list(grid.product)
        overrides += [dict(zip(axes, combo)) for combo in itertools.product(*grid.product.values())]
    overrides += [dict(cell) for cell in grid.cells]
    overrides += [{"method": b} for b in grid.baselines]
    return overrides


def _replicates(overrides: list[dict], seeds: int, base: Pretrain) -> list[dict]:
    """``grid.seeds``: every cell N times, seeds seed, seed+1, ... (its own seed or the base's)."""
    return [{**o, "seed": o.get("seed", base.seed) + i} if i else o for o in overrides for i in range(seeds)]


def training_set_size(cfg: Config) -> int | None:
    """Known at DAG build for the embedded dataset; for other sources the stage checks it."""
    if cfg.dataset.source != "synthetic":
        return None
    return synthetic_images(cfg.dataset)


def check_cell(cid: str, base: Pretrain, override: dict, num_samples: int | None = None) -> Pretrain:
    """The cell: the (typed) base cell with the override applied (dataclasses.replace),
    validated as any pretrain section."""
    try:
        return pretrain_cell(base, override, num_samples=num_samples)
    except ConfigError as err:
        raise ConfigError(f"ablation cell '{cid}' is impossible: {err}") from None


def grid_cells(cfg: Config) -> dict[str, Cell]:
    """All cells of the grid: id -> the cell (validated)."""
    return only(_cells(cfg, _sweep_overrides(cfg.grid)), cfg.grid.only)


def claims_overrides(claims: Claims, base: Pretrain, grid: Grid | None = None) -> dict[str, dict]:
    """The cells the claims study needs (``snakemake claims``), as overrides of the base cell,
    by role: a reference cell trained ``claims.epochs``; around it each m, each K under each
    queue policy and the memory bank; the reference trained ``claims.long_epochs``; random init
    (m = 0's direct measure); the pilot: the reference and random init at the seeds after the
    compared ones (whether the reference learnt something, never compared); the MoCo v2 report's
    steps, each taken away alone where the base has it: v1's linear head for v2's MLP head, v2's
    augmentation without its blur; the grid's MoCo v3 ViT (the first of ``grid.cells``; none
    without a grid) with its patch projection frozen and learned, at its recipe's lr and at
    LARGE_LR_FACTOR x it, its kNN monitor every epoch (a dip shows between two checks); and the
    rivals: SimCLR at the base batch and at LARGE_BATCH x it, BYOL, without its predictor,
    without the EMA."""
    first = claims.seed(base.seed)
    start = {} if first == base.seed else {"seed": first}  # at the base's seed a cell's id has none
    short = {"epochs": claims.epochs, **start}
    pilot = {"seed": first + claims.seeds}

    def policy(name):  # the base's own policy (unset: FIFO) is the same cell as the base's
        return {} if name == base.queue_policy else {"queue_policy": name}

    def vit_roles() -> dict[str, dict]:
        values = to_dict(base)
        vit = None if grid is None else vit_cell(grid.cells, values)
        if grid is None or vit is None:
            return {}
        frozen, learned = ({**short, **vit, "freeze_patch_embed": f, "knn_every": 1} for f in (True, False))
        high = {"lr": {**values, **with_recipe(grid, frozen, values)}["lr"] * LARGE_LR_FACTOR}
        return {
            "vit_frozen": frozen,
            "vit_learned": learned,
            "vit_frozen_high": {**frozen, **high},
            "vit_learned_high": {**learned, **high},
        }

    return {
        "reference": short,
        **{f"m={m}": {**short, "m": m} for m in claims.m},
        **{f"K={k},{p}": {**short, "K": k, **policy(p)} for k in claims.K for p in QUEUE_POLICIES},
        "memory_bank": {**short, "mechanism": "memory_bank"},
        "long": {"epochs": claims.long_epochs, **start},
        "random": {"method": "random", **start},  # the grid's baseline cell: no training, any length
        "pilot": {**short, **pilot},
        "pilot_random": {"method": "random", **pilot},
        # the MoCo v2 report's steps, each taken away alone where the base has it
        **({"v1_head": {**short, "variant": "v1"}} if base.variant == "v2" else {}),  # v1: a linear head
        **({"no_blur": {**short, "aug": "cifar"}} if base.aug == "v2" else {}),  # aug+ without its blur
        **vit_roles(),
        # the rivals at the reference's epochs, each with its recipe (pipeline.dag.recipes)
        "simclr": {**short, "method": "simclr"},
        "simclr_few": {**short, "method": "simclr", "negatives": fewer_negatives(base.batch_size)},
        "simclr_large": {**short, "method": "simclr", "batch_size": LARGE_BATCH * base.batch_size},
        "byol": {**short, "method": "byol"},
        "byol_no_predictor": {**short, "method": "byol", "predictor": False},
        # the same ablation under BYOL's own rule (LARS), beside the embedded recipe's SGD
        "byol_no_predictor_lars": {**short, "method": "byol", "predictor": False, **byol_rule(to_dict(base))},
        "byol_no_ema": {**short, "method": "byol", "m": 0.0},
    }


def byol_rule(base: dict) -> dict:
    """BYOL's paper's optimiser, lr and weight decay at the base cell's batch (its method rule,
    without grid.byol's recipe for the embedded data)."""
    rule = method_spec("byol").recipe
    assert rule is not None
    found = rule({**base, "method": "byol"})
    return {k: found[k] for k in ("optimizer", "lr", "weight_decay")}


def claims_budget(cfg: Config) -> Budget:
    """The claims' experiment size from the config and the training set's size (known before
    any job; pipeline.dag.training_set raises where it is not)."""
    return budget_of(cfg, training_set(cfg))


def budget_of(cfg: Config, data) -> Budget:
    """The claims' Budget over ``data`` (pipeline.dag.training_set's): the reference's batch,
    epochs and m, and the target decay BYOL's cells train with (its recipe beneath grid.byol)."""
    assert cfg.claims is not None
    base = to_dict(cfg.pretrain)
    byol = {**base, **with_recipe(cfg.grid, {"method": "byol"}, base)}
    return Budget(data.images, data.classes, cfg.pretrain.batch_size, cfg.claims.epochs, cfg.pretrain.m, byol["m"])


def claims_cells(cfg: Config) -> dict[str, Cell]:
    """The claims study's cells: id -> the cell (validated); ``claims.seeds`` of each cell a
    claim this budget can decide needs, none of those only undecidable claims would need
    (pipeline.dag.claims_plan.not_trained says which and why)."""
    base, claims = cfg.pretrain, cfg.claims
    if claims is None:
        raise ConfigError("the config has no 'claims' section (workflow/config/config.yaml has one)")
    if not (base.is_moco and base.has_queue):
        raise ConfigError(
            "claims: the claims vary the queue and the momentum of MoCo v1/v2; the base cell "
            f"(pretrain) is method={base.method} variant={base.variant} mechanism={base.mechanism}"
        )
    overrides = claims_overrides(claims, base, cfg.grid)
    seeds = role_seeds(claims, claims_budget(cfg), overrides)
    return _cells(cfg, [r for role, o in overrides.items() for r in _replicates([o], seeds[role], base)], 1)


def _cells(cfg: Config, overrides: list[dict], seeds: int | None = None) -> dict[str, Cell]:
    """The cells of ``overrides``, ``seeds`` of each (None: grid.seeds)."""
    base, num_samples = to_dict(cfg.pretrain), training_set_size(cfg)
    seeds = cfg.grid.seeds if seeds is None else seeds
    cells: dict[str, Cell] = {}
    for override in _replicates(overrides, seeds, cfg.pretrain):
        cid = cell_id(base, {**base, **override})
        override = with_recipe(cfg.grid, override, base)
        cells.setdefault(cid, Cell(check_cell(cid, cfg.pretrain, override, num_samples), override))
    return cells


def only(cells: dict[str, Cell], chosen: Sequence[str] | None) -> dict[str, Cell]:
    """The cells of ``chosen`` (grid.only; a cell's id or its seed-less group id), all if None."""
    if not chosen:
        return cells
    unknown = [c for c in chosen if not any(c in (cid, group_id(cid)) for cid in cells)]
    if unknown:
        raise ConfigError(f"grid.only: {unknown} not in the grid (its cells: {', '.join(cells)})")
    return {cid: p for cid, p in cells.items() if cid in chosen or group_id(cid) in chosen}


def cell_params(cfg: Config, cid: str) -> Cell:
    """A cell given by id, whether or not it is in the declared grid."""
    override = with_recipe(cfg.grid, parse_cell_id(cid), to_dict(cfg.pretrain))
    return Cell(check_cell(cid, cfg.pretrain, override, num_samples=training_set_size(cfg)), override)


# Pretraining cost of one epoch relative to a ResNet-18, per backbone (rough, for job sizing).
BACKBONE_COST = {"resnet18": 1.0, "resnet50": 2.5, "vit_tiny": 1.0, "vit_small": 2.0, "vit_base": 6.0}


def momentum_reference(ids) -> str:
    """The cell the momentum ablation sits around: the one that most of the cells ``ids``
    differ from in m alone; the base unless the m sweep is elsewhere (e.g. MoCo v1's at
    K = 4096, where the paper measured its Table 1)."""
    neighbours: dict[str, int] = {}
    for cid in ids:
        params = parse_cell_id(cid)
        if "m" in params:
            reference = cell_id({}, {k: v for k, v in params.items() if k != "m"})
            neighbours[reference] = neighbours.get(reference, 0) + 1
    return max([BASE_ID, *neighbours], key=lambda ref: (neighbours.get(ref, 0), ref == BASE_ID))


def group_id(cid: str) -> str:
    """The cell id without its seed: cells that differ only in seed are replicates of one point."""
    parts = [p for p in str(cid).split(",") if p and not p.startswith("seed=") and p != BASE_ID]
    return ",".join(parts) or BASE_ID


def detects(detect: Detect, cid: str, p: Pretrain) -> bool:
    """Detection transfer for this cell? ResNet backbones only, and only the chosen cells
    (with every seed of them: a cell's replicates are chosen with it)."""
    chosen = detect.cells
    return detect.enabled and is_resnet(p.backbone) and ("all" in chosen or cid in chosen or group_id(cid) in chosen)


def cell_resources(p: Pretrain, spec: Resources) -> dict:
    """Job resources of one cell's pretraining, scaled with the cell (``grid.resources``).

    nodes   = max(nodes, ceil(batch_size / batch_per_node))  (batch_per_node null: always ``nodes``)
    runtime = overhead + minutes_per_epoch * epochs * backbone_cost / nodes   (minutes, rounded up)

    The random-init baseline does not train: overhead only, one node.
    """
    cost = {**BACKBONE_COST, **spec.backbone_cost}[p.backbone]
    if not p.trains:
        return {"runtime": max(1, math.ceil(spec.overhead_minutes)), "nodes": 1}
    nodes = spec.nodes
    if spec.batch_per_node:
        nodes = max(nodes, math.ceil(p.batch_size / spec.batch_per_node))
    minutes = spec.overhead_minutes + spec.minutes_per_epoch * p.epochs * cost / nodes
    return {"runtime": max(1, math.ceil(minutes)), "nodes": nodes}
