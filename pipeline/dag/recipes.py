"""Each cell's recipe: a cell that switches method, MoCo variant or backbone takes the recipe of
what it switched to, never another's lr.

Beneath a cell's own values lie grid.<method>'s set keys (a method's recipe for the embedded
data), and beneath those its method's rule (MethodSpec.recipe: its paper's, lr by the batch).
The recipe is not part of a cell's id.

Standard library only: Snakemake imports this while it builds the DAG.
"""

from __future__ import annotations

import dataclasses

from pipeline.dag.sections import Grid
from pipeline.methods import method_spec
from pipeline.methods.section import Pretrain

# the pretrain keys whose change gives a cell another recipe
SWITCHES = ("method", "variant", "backbone")


def stated_recipe(grid: Grid, cell: dict) -> dict:
    """The set keys of the grid's recipe slot beneath ``cell`` (grid.<method>, MoCo v3's by
    backbone; none for MoCo v1/v2, random init, or a slot left at null)."""
    recipe = grid.recipe(cell)
    if recipe is None:
        return {}
    return {
        f.name: _listed(getattr(recipe, f.name))
        for f in dataclasses.fields(recipe)
        if getattr(recipe, f.name) is not None
    }


def _listed(value):
    return list(value) if isinstance(value, tuple) else value


def with_recipe(grid: Grid, override: dict, base: dict) -> dict:
    """A cell's override (keys over ``base``, a pretrain dict) with its recipe beneath it, where
    it switches method, variant or backbone; as given otherwise."""
    if not set(SWITCHES) & set(override):
        return override
    cell = {**base, **override}
    stated = stated_recipe(grid, cell)
    rule = method_spec(cell["method"]).recipe
    ruled = rule({**base, **stated, **override}) if rule is not None else {}
    return {**ruled, **stated, **override}


def base_with_recipe(base: Pretrain, grid: Grid) -> dict:
    """The base cell's (pretrain's) values that its recipe sets: the base is a cell over the
    declared defaults (MoCo v2 on a ResNet-18, config.yaml's pretrain section), the keys it sets
    to other values its override; where that switches method, variant or backbone, its recipe
    lies beneath them. {} where it switches none, or the recipe changes nothing."""
    declared, values = _as_dict(Pretrain()), _as_dict(base)
    override = {k: v for k, v in values.items() if v != declared[k]}
    resolved = with_recipe(grid, override, declared)
    return {k: v for k, v in resolved.items() if values.get(k) != v}


def _as_dict(p: Pretrain) -> dict:
    return {f.name: _listed(getattr(p, f.name)) for f in dataclasses.fields(p)}
