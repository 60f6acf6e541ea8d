"""The ablation grid: a base cell plus sweeps, expanded to cells with stable, readable ids.

A cell id lists only the parameters that differ from the base, in a fixed axis order, e.g.
``base``, ``K=1024``, ``K=1024,m=0.9`` or ``method=random``. Identical cells reached from
different sweeps get the same id, so they are one job.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import yaml

from pipeline.claims_plan import Budget, role_seeds
from pipeline.config import ConfigError, as_section, merge, pretrain_cell, section, to_dict
from pipeline.layout import QUEUE_POLICIES
from pipeline.sections import Claims, Grid, Pretrain, Resources

AXES = [
    "method",
    "variant",
    "mechanism",
    "backbone",
    "width",
    "K",
    "m",
    "T",
    "epochs",
    "batch_size",
    "lr",
    "aug",
    "shuffle_bn",
    "dim",
    "queue_policy",
    "symmetric",
    "seed",
]
BASE_ID = "base"


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
    overrides += [{"method": b} for b in grid.baselines]
    return overrides


def _replicates(overrides: list[dict], seeds: int, base: dict) -> list[dict]:
    """``grid.seeds``: every cell N times, seeds seed, seed+1, ... (its own seed or the base's)."""
    return [
        {**o, "seed": as_section(Pretrain, merge(base, o)).seed + i} if i else o
        for o in overrides
        for i in range(seeds)
    ]


def training_set_size(cfg: dict) -> int | None:
    """Known at DAG build for the embedded dataset; for other sources the stage checks it."""
    ds = cfg.get("dataset") or {}
    if ds.get("source") != "synthetic":
        return None
    from pipeline.synthetic import CLASSES, DEFAULTS

    return len(CLASSES) * {**DEFAULTS, **(ds.get("synthetic") or {})}["train_per_class"]


def check_cell(cid: str, base: Pretrain, override: dict, num_samples: int | None = None) -> None:
    """The cell is the (typed) base cell with the override applied (dataclasses.replace),
    validated as any pretrain section."""
    try:
        pretrain_cell(base, override, num_samples=num_samples)
    except ConfigError as err:
        raise ConfigError(f"ablation cell '{cid}' is impossible: {err}") from None


def grid_cells(cfg: dict) -> dict[str, dict]:
    """All cells of the grid: id -> full pretrain parameters (validated)."""
    grid = section("grid", cfg.get("grid"))
    return only(_cells(cfg, _sweep_overrides(grid)), grid.only)


def claims_overrides(claims: Claims, base: Pretrain) -> dict[str, dict]:
    """The cells the claims study needs (``snakemake claims``), as overrides of the base cell,
    by role: a reference cell trained ``claims.epochs``; around it each m, each K under each
    queue policy and the memory bank; the reference trained ``claims.long_epochs``; and random
    init (the level a run on the loss plateau sits at, and m = 0's direct measure)."""
    short = {"epochs": claims.epochs}

    def policy(name):  # the base's own policy (unset: FIFO) is the same cell as the base's
        return {} if name == base.queue_policy else {"queue_policy": name}

    return {
        "reference": short,
        **{f"m={m}": {**short, "m": m} for m in claims.m},
        **{f"K={k},{p}": {**short, "K": k, **policy(p)} for k in claims.K for p in QUEUE_POLICIES},
        "memory_bank": {**short, "mechanism": "memory_bank"},
        "long": {"epochs": claims.long_epochs},
        "random": {"method": "random"},  # the grid's baseline cell: no training, any length
    }


def claims_cells(cfg: dict) -> dict[str, dict]:
    """The claims study's cells: id -> full pretrain parameters (validated); ``claims.seeds`` of
    each cell a claim this budget can decide needs, one of the others (pipeline.claims_plan)."""
    base = section("pretrain", cfg["pretrain"])
    if "claims" not in cfg:
        raise ConfigError("the config has no 'claims' section (workflow/config/config.yaml has one)")
    if base.method != "moco" or base.variant == "v3" or base.mechanism != "moco":
        raise ConfigError(
            "claims: the claims vary the queue and the momentum of MoCo v1/v2; the base cell "
            f"(pretrain) is method={base.method} variant={base.variant} mechanism={base.mechanism}"
        )
    claims = section("claims", cfg["claims"])
    overrides = claims_overrides(claims, base)
    budget = Budget(training_set_size(cfg), None, base.batch_size, claims.epochs)
    seeds = role_seeds(claims, budget, overrides)
    return _cells(cfg, [r for role, o in overrides.items() for r in _replicates([o], seeds[role], cfg["pretrain"])], 1)


def with_recipe(grid: Grid, override: dict) -> dict:
    """A supervised cell's override with the baseline's own recipe (grid.supervised, its set
    keys) beneath it; every other cell's as given. The recipe is not part of the cell's id."""
    if override.get("method") != "supervised":
        return override
    return {**{k: v for k, v in to_dict(grid.supervised).items() if v is not None}, **override}


def _cells(cfg: dict, overrides: list[dict], seeds: int | None = None) -> dict[str, dict]:
    """The cells of ``overrides``, ``seeds`` of each (None: grid.seeds)."""
    base, typed_base = cfg["pretrain"], section("pretrain", cfg["pretrain"])  # typed once, not per cell
    grid, num_samples = section("grid", cfg.get("grid")), training_set_size(cfg)
    seeds = grid.seeds if seeds is None else seeds
    cells: dict[str, dict] = {}
    for override in _replicates(overrides, seeds, base):
        cid = cell_id(base, merge(base, override))
        override = with_recipe(grid, override)
        check_cell(cid, typed_base, override, num_samples)
        cells.setdefault(cid, merge(base, override))
    return cells


def only(cells: dict[str, dict], chosen: Sequence[str] | None) -> dict[str, dict]:
    """The cells of ``chosen`` (grid.only; a cell's id or its seed-less group id), all if None."""
    if not chosen:
        return cells
    unknown = [c for c in chosen if not any(c in (cid, group_id(cid)) for cid in cells)]
    if unknown:
        raise ConfigError(f"grid.only: {unknown} not in the grid (its cells: {', '.join(cells)})")
    return {cid: p for cid, p in cells.items() if cid in chosen or group_id(cid) in chosen}


def cell_params(cfg: dict, cid: str) -> dict:
    """Parameters of a cell given by id, whether or not it is in the declared grid."""
    override = with_recipe(section("grid", cfg.get("grid")), parse_cell_id(cid))
    check_cell(cid, section("pretrain", cfg["pretrain"]), override, num_samples=training_set_size(cfg))
    return merge(cfg["pretrain"], override)


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


def cell_resources(params: Pretrain | dict, spec: Resources | dict | None = None) -> dict:
    """Job resources of one cell's pretraining, scaled with the cell (``grid.resources``).

    nodes   = max(nodes, ceil(batch_size / batch_per_node))  (batch_per_node null: always ``nodes``)
    runtime = overhead + minutes_per_epoch * epochs * backbone_cost / nodes   (minutes, rounded up)

    The random-init baseline does not train: overhead only, one node.
    """
    p, spec = as_section(Pretrain, params), as_section(Resources, spec or {})
    cost = {**BACKBONE_COST, **spec.backbone_cost}[p.backbone]
    if p.method == "random":
        return {"runtime": max(1, math.ceil(spec.overhead_minutes)), "nodes": 1}
    nodes = spec.nodes
    if spec.batch_per_node:
        nodes = max(nodes, math.ceil(p.batch_size / spec.batch_per_node))
    minutes = spec.overhead_minutes + spec.minutes_per_epoch * p.epochs * cost / nodes
    return {"runtime": max(1, math.ceil(minutes)), "nodes": nodes}


def rejoin_target_wildcards(specs, wildcard_names) -> list:
    """Target jobs (``--target-jobs``, how a cluster job names the one job it runs) with the cell
    ids put together again. Snakemake 9.27's parser splits a job's wildcards at every comma,
    also inside the quotes the executor plugins put around a value that has commas, so a cluster
    job of cell ``K=128,seed=1`` would run cell ``K=128`` (and its outputs would never appear).
    A piece whose key is not a wildcard of the rule (``wildcard_names(rule)``) belongs to the
    value before it. ``specs``: Snakemake's TargetSpec tuples (rulename, wildcards_dict)."""
    rejoined = []
    for spec in specs:
        names, wildcards, last = set(wildcard_names(spec.rulename)), {}, None
        for key, value in spec.wildcards_dict.items():
            if key in names or last is None:
                wildcards[key], last = value, key
            else:
                wildcards[last] += f",{key}={value}"
        rejoined.append(type(spec)(spec.rulename, wildcards))
    return rejoined


def rejoin_cells_in_cluster_jobs() -> None:
    """Make Snakemake's DAG rejoin the cell ids of its target jobs (rejoin_target_wildcards).
    Called from the Snakefile: the DAG settings that hold the target jobs are attached to the
    workflow only after the Snakefile is read, so the repair runs where the DAG is made."""
    from snakemake import dag  # type: ignore[import-untyped]

    make = getattr(dag.DAG.__init__, "wrapped", dag.DAG.__init__)  # Snakemake's own, once

    def init(self, workflow, *args, **kwargs):
        settings = workflow.dag_settings
        if settings is not None and settings.target_jobs:
            settings.target_jobs = rejoin_target_wildcards(
                settings.target_jobs, lambda rule: workflow.get_rule(rule).wildcard_names
            )
        make(self, workflow, *args, **kwargs)

    init.wrapped = make  # type: ignore[attr-defined]
    dag.DAG.__init__ = init
