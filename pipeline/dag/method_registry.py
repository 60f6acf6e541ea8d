"""Every pretraining method (``pretrain.method``) in one place: what the config, the grid, the
optimiser, the tables and the figures ask of it.

Standard library only: building the DAG reads it (the schema's method enum, which cells have a
queue) and imports no torch. Each method's builder is reached through a function that imports
it when a model is built (pipeline.nets.methods.build_model), so editors follow it as code.

Adding a method: its model in a file of its own (a pipeline.moco.method.Method, with a builder
``build(p, backbone, num_classes, num_samples, world_size) -> Method``) and one ``register``
call below (+ a pipeline.dag.sections.Pretrain field for each new key). tests/test_method_registry.py
registers one from the test file and takes it through the grid, a pretraining, the tables and
the figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.dag.sections import Pretrain


def no_queue(p: Pretrain) -> bool:
    return False


def moco_queue(p: Pretrain) -> bool:
    """MoCo v1/v2 keep their negatives in a queue; v3 and the other mechanisms do not."""
    return p.variant != "v3" and p.mechanism == "moco"


def recipe_optimizer(p: Pretrain) -> str:
    """The MoCo recipes' optimiser (``optimizer: auto``): SGD (v1/v2), LARS (v3 ResNet), AdamW (v3 ViT)."""
    if p.variant == "v3":
        return "adamw" if p.is_vit else "lars"
    return "sgd"


@dataclass(frozen=True)
class MethodSpec:
    name: str  # pretrain.method's value (the schema's enum: pipeline.dag.config.load_schema)
    label: str  # its rows' label in the method and detection tables
    order: int  # where its rows stand in those tables (lower first; 10 apart, room between)
    # returns the function building its model from the section and a backbone (a function that
    # imports it: the model's module needs torch, the DAG does not); None for a method that
    # trains nothing (pipeline.pretrain stores the random backbone)
    builder: Callable[[], Callable] | None
    moco: bool = False  # a MoCo variant: the MoCo studies (ablations, figures, claims) take its cells
    trains: bool = True  # False: the random-init baseline (only the INIT keys matter)
    has_queue: Callable[[Pretrain], bool] = no_queue  # negatives from a queue (K, queue_policy apply)
    optimizer: Callable[[Pretrain], str] = recipe_optimizer  # its optimiser under ``optimizer: auto``
    # its cross-field rules, ``check(p, where, num_samples)`` raising ConfigError; None: none
    # beyond every cell's
    check: Callable[[Pretrain, str, int | None], None] | None = None

    def build_function(self) -> Callable:
        if self.builder is None:
            raise ValueError(f"method '{self.name}' trains nothing: it has no model to build")
        return self.builder()


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.name in METHODS:
        raise ValueError(f"method '{spec.name}' is registered already")
    METHODS[spec.name] = spec
    return spec


def method_spec(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown method '{name}' (known: {', '.join(METHODS)})")
    return METHODS[name]


def is_moco(name: str | None) -> bool:
    """Whether a cell's method (as its parameters record it; absent or unknown: no) is a MoCo variant."""
    return name in METHODS and METHODS[name].moco


def method_label(name: str) -> str:
    """The tables' label of a method (one no longer registered: its name)."""
    return METHODS[name].label if name in METHODS else name


def row_order(name: str | None) -> int:
    """Where a method's rows stand in the tables (one no longer registered: last)."""
    return METHODS[name].order if name in METHODS else max(s.order for s in METHODS.values()) + 1


def moco_builder() -> Callable:
    from pipeline.nets.methods import build_moco

    return build_moco


def supervised_builder() -> Callable:
    from pipeline.nets.methods import build_supervised

    return build_supervised


def moco_rules(p: Pretrain, where: str, num_samples: int | None) -> None:
    from pipeline.dag.config import check_moco  # here: pipeline.dag.config imports this module

    check_moco(p, where, num_samples)


register(MethodSpec("moco", "MoCo", 10, moco_builder, moco=True, has_queue=moco_queue, check=moco_rules))
register(MethodSpec("supervised", "supervised", 20, supervised_builder))
register(MethodSpec("random", "random init", 30, None, trains=False))
