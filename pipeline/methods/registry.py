"""What the config, the grid, the optimiser, the tables and the figures ask of a pretraining
method: its entry (MethodSpec), registered once by its own module (pipeline/methods/<name>).

Standard library only: building the DAG reads the entries (the schema's method enum, which
cells have a queue, each method's config check) and imports no torch. A method's model is built
through its ``build`` function, which imports the torch half of its module when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from pipeline.nets.method import Method

# a pretrain section (pipeline.methods.section.Pretrain), which reads this registry: named here by
# its role only, so that the two do not import each other
Pretrain = Any
# build(p, backbone, num_classes, num_samples, world_size) -> the method's model on that backbone
Builder = Callable[[Pretrain, "nn.Module", int, int, int], "Method"]


def no_queue(p: Pretrain) -> bool:
    return False


def recipe_optimizer(p: Pretrain) -> str:
    """The MoCo recipes' optimiser (``optimizer: auto``), every method's unless its entry says
    otherwise: SGD (v1/v2), LARS (v3 ResNet), AdamW (v3 ViT)."""
    if p.variant == "v3":
        return "adamw" if p.is_vit else "lars"
    return "sgd"


@dataclass(frozen=True)
class Metric:
    """A metric a method reports with each step (``Step.metrics``): how log.csv holds it and how
    a cell's curves figure draws it. The loop logs whatever a method reports; this says how."""

    name: str
    label: str | None = None  # its line on the curves' pretext axis (%); None: not drawn
    scale: float = 1.0  # drawn as value x scale (a fraction on the % axis: 100)
    decimals: int = 5  # in log.csv
    logged: bool = True  # False: a reference value, not a measurement: the summary's, not log.csv's


# the cross-entropy family's (a loss over candidates: MoCo, SimCLR, supervised; their report is
# pipeline.methods.cross_entropy): the instance accuracy (%) and the loss at chance, its reference
CROSS_ENTROPY_METRICS = (
    Metric("inst_acc", "instance (pretext)", decimals=3),
    Metric("chance_loss", logged=False),
)


@dataclass(frozen=True)
class MethodSpec:
    name: str  # pretrain.method's value (the schema's enum: pipeline.dag.config.load_schema)
    label: str  # its rows' label in the method and detection tables
    order: int  # where its rows stand in those tables (lower first; 10 apart, room between)
    build: Builder | None  # None: a method that trains nothing (pipeline.pretrain stores the random backbone)
    moco: bool = False  # a MoCo variant: the MoCo studies (ablations, figures, claims) take its cells
    trains: bool = True  # False: the random-init baseline (only the INIT keys matter)
    has_queue: Callable[[Pretrain], bool] = no_queue  # negatives from a queue (K, queue_policy apply)
    optimizer: Callable[[Pretrain], str] = recipe_optimizer  # its optimiser under ``optimizer: auto``
    # its cross-field rules, ``check(p, where, num_samples)`` raising ConfigError; None: none
    # beyond every cell's
    check: Callable[[Pretrain, str, int | None], None] | None = None
    # its recipe where a cell switches to it from the base cell's method: ``recipe(cell)`` (the
    # cell's pretrain values) -> the keys it sets (e.g. lr by its paper's rule from the batch);
    # grid.<method> and the cell's own values override them. None: the base cell's settings
    recipe: Callable[[dict], dict] | None = None
    # its recipe slots in the grid section, each holding its recipe beneath the cells it names: slot
    # -> its default, the recipe on the embedded data where the paper's rule does not learn there
    # (pretrain keys; chosen on held-out training images, docs/studies/). None: grid.<name> with no
    # default for a method that trains outside MoCo's recipe, none for the others. Presets for other
    # data state their own
    recipe_slots: Mapping[str, Mapping[str, Any]] | None = None
    # the slot beneath a cell (its pretrain values); None: its method's only slot, if it has one
    slot_of: Callable[[dict], str | None] | None = None
    metrics: tuple[Metric, ...] = ()  # what its Step.metrics hold (others are logged as reported)

    def slots(self) -> dict[str, Mapping[str, Any]]:
        """Its recipe slots in the grid section: slot -> the recipe's default."""
        if self.recipe_slots is not None:
            return dict(self.recipe_slots)
        return {self.name: {}} if self.trains and not self.moco else {}

    def slot(self, cell: Mapping[str, Any]) -> str | None:
        """The grid slot whose recipe lies beneath ``cell`` (None: none)."""
        if self.slot_of is not None:
            return self.slot_of(dict(cell))
        return next(iter(self.slots()), None)

    def builder(self) -> Builder:
        if self.build is None:
            raise ValueError(f"method '{self.name}' trains nothing: it has no model to build")
        return self.build


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


def reported_metrics() -> dict[str, Metric]:
    """Every registered method's metrics by name (the curves figure draws the ones a log holds)."""
    return {m.name: m for spec in METHODS.values() for m in spec.metrics}


def row_order(name: str | None) -> int:
    """Where a method's rows stand in the tables (one no longer registered: last)."""
    return METHODS[name].order if name in METHODS else max(s.order for s in METHODS.values()) + 1
