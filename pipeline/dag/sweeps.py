"""Which of the paper's studies a set of cells sweeps, and the command that runs one it does not.

A study's table or figure is written only where the cells hold its sweep: an ablation with one
row, or "accuracy vs K" with one point, reads as a result and is none. The tables stage writes
the swept ones (pipeline.tables) and lists the others in all.md with the command that runs
them; the Snakefile declares the same ones as the stage's outputs. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline.base.layout import FIGURES, STUDY_NAMES
from pipeline.dag.grid import BASE_ID, Cell, cell_id, detects, group_id, momentum_reference, parse_cell_id
from pipeline.dag.sections import Detect
from pipeline.methods.section import Pretrain

ALWAYS = ("methods", "grid")  # the main table and every cell: written from the base alone
# a one-axis study: the cells that differ from the base in these axes alone
AROUND_BASE = {
    "ablation_K": {"K"},
    "ablation_epochs": {"epochs"},
    "mechanisms": {"mechanism", "K", "batch_size"},
    "shuffle_bn": {"shuffle_bn"},
}
TRANSFER = {"detection": ("detection",), "segmentation": ("detection", "segmentation")}  # detect.task -> studies
# a figure is drawn where its study is swept; None: drawn from any cells
FIGURE_STUDY = {"accuracy_vs_K": "mechanisms", "accuracy_vs_m": "ablation_m", "bn_leak": "shuffle_bn"}
# values a command suggests for an axis the config's grid.one_at_a_time does not sweep
EXAMPLE_VALUES = {
    "K": lambda base: [base.K * 4],
    "epochs": lambda base: [base.epochs * 2],  # the paper's 100 -> 200
    "mechanism": lambda base: ["end_to_end", "memory_bank"],
    "shuffle_bn": lambda base: [not base.shuffle_bn],
    "m": lambda base: [0.9, 0.999],
}
# the axis a study's command adds values of
STUDY_AXIS = {
    "ablation_K": "K",
    "ablation_epochs": "epochs",
    "ablation_m": "m",
    "mechanisms": "mechanism",
    "shuffle_bn": "shuffle_bn",
}


def swept(ids: Iterable[str], transfer: str | None = None) -> list[str]:
    """The studies (STUDY_NAMES, in order) whose sweep the cells ``ids`` hold. ``transfer``: the
    detect.task of the cells that are fine-tuned (None: no cell is)."""
    groups = {group_id(cid) for cid in ids}
    diffs = [parse_cell_id(g) for g in groups]
    found = set(ALWAYS) | set(TRANSFER.get(transfer or "", ()))
    for name, axes in AROUND_BASE.items():
        if any(d and set(d) <= axes for d in diffs):
            found.add(name)
    reference = parse_cell_id(momentum_reference(groups))
    if any("m" in d and {k: v for k, v in d.items() if k != "m"} == reference for d in diffs):
        found.add("ablation_m")
    return [name for name in STUDY_NAMES if name in found]


def fine_tuned(detect: Detect, cells: Mapping[str, Cell]) -> str | None:
    """detect.task where the detect stage fine-tunes any of these cells, else None."""
    return detect.task if any(detects(detect, cid, cell.pretrain) for cid, cell in cells.items()) else None


def drawn(studies: Iterable[str]) -> list[str]:
    """The figures (FIGURES, in order) of these swept studies."""
    studies = set(studies)
    return [f for f in FIGURES if FIGURE_STUDY.get(f) in (None, *studies)]


def command(study: str, base: Pretrain, one_at_a_time: Mapping | None = None) -> str:
    """The command that adds ``study``'s cells to the workflow's own: the grid's values for its
    axis where grid.one_at_a_time has them, an example otherwise."""
    if study in TRANSFER:
        return f"snakemake --config detect='{{enabled: true, task: {study}}}'"
    axis = STUDY_AXIS[study]
    values = list((one_at_a_time or {}).get(axis) or EXAMPLE_VALUES[axis](base))
    cells = [cell_id({}, {axis: v}) for v in values]
    shown = ", ".join(_yaml(v) for v in values)
    return f"snakemake --config grid='{{only: [{BASE_ID}, {', '.join(cells)}], one_at_a_time: {{{axis}: [{shown}]}}}}'"


def _yaml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
