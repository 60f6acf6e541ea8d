"""What the tables show: every cell's metrics, grouped over seeds, and the paper's studies.

``collect`` reads whatever exists under ``<results>/cells/*`` (plus the cells the grid expects,
so that a cell not computed yet still gets its row). Cells that differ only in ``seed`` form
one *group*, shown as mean ± the half-width of its 95 % confidence interval, with n. Rows compare
with a reference group (the base, or random init) paired by seed (pipeline.report.stats). Each study
function returns a ``Table`` (rows of key strings and ``Value``s) that pipeline.tables renders as
Markdown, CSV and LaTeX.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.base.layout import BACKBONE_LABELS, is_resnet, is_vit
from pipeline.dag.claims_plan import half_life
from pipeline.dag.config import ConfigError, merge, section
from pipeline.dag.grid import AXES, BASE_ID, format_value, group_id, momentum_reference, parse_cell_id
from pipeline.dag.sections import SYNTHETIC_CLASSES, Dataset, Detect, Probe
from pipeline.methods import is_moco, method_label, row_order
from pipeline.methods.section import Pretrain
from pipeline.report import stats
from pipeline.report.records import (
    TRANSFER_KEYS,
    CellOutputs,
    ConversionReport,
    ProbeRecord,
    Summary,
    from_json,
    read_json,
)
from pipeline.runtime.provenance import environment_note

METRICS = {
    "inst_acc": "instance accuracy",
    "top1": "linear top-1",
    "top5": "linear top-5",
    "knn_top1": "kNN top-1",
    "AP50": "AP50",
    "AP": "AP",
    "AP75": "AP75",
    "APs": "APs",
    "APm": "APm",
    "APl": "APl",
    **{f"mask_{k}": f"mask {k}" for k in ("AP50", "AP", "AP75", "APs", "APm", "APl")},
    "drift": "key-encoder drift (%)",
    "queue_age_p99": "p99 age (steps)",
    "queue_age_max": "max age (steps)",
    "negative_drift_mean": "negatives' drift, mean (%)",
    "negative_drift_max": "negatives' drift, max (%)",
}
DECIMALS = {"drift": 2, "negative_drift_mean": 3, "negative_drift_max": 3}  # drifts are small; the rest: 1
ABLATION_METRICS = ["top1", "knn_top1", "AP50", "AP", "AP75"]
DETECTION_METRICS = ["AP50", "AP", "AP75"]
MASK_METRICS = [f"mask_{k}" for k in DETECTION_METRICS]  # Mask R-CNN's (detect.task: segmentation)
# detect.task -> the model fine-tuned and what it scores; detect.head -> its name (the report's
# captions, workflow/report/*.rst, name them alike: tests/test_report_captions.py)
DETECTORS = {"detection": ("Faster R-CNN", "box AP"), "segmentation": ("Mask R-CNN", "box and mask AP")}
HEAD_LABELS = {"fpn": "FPN", "c4": "C4"}
SAMPLES = "_samples"  # column suffix: a metric's values per trial within the cell
PAPER_M = [0, 0.5, 0.9, 0.99, 0.999, 0.9999]  # the MoCo paper's momentum rows, and the seeds' m = 0.5
MECHANISMS = {"end_to_end": "end-to-end", "memory_bank": "memory bank", "moco": "MoCo"}
RANDOM_ID, RANDOM_LABEL = "method=random", method_label("random")  # the main table's reference
SUPERVISED_ID, SUPERVISED_LABEL = "method=supervised", method_label("supervised")
SEPARATE = {"method", "variant", "backbone", "mechanism", "K", "m", "epochs", "seed", "shuffle_bn"}  # own study or none
# the BN leak's signature (paper 3.3): without the guard the pretext task gets easier (instance
# accuracy up) while the representation gets worse (probe accuracy down)
BN_LEAK_METRICS = ["inst_acc", "top1", "knn_top1"]


# --- per-cell metrics -----------------------------------------------------------------------
def stated(params: dict, key: str):
    """A parameter as a config states it; None where it states none."""
    return params[key] if key in params else None


def _params(cell: str, on_disk: dict | None, expected: dict, base: dict | None) -> dict:
    if on_disk:
        return on_disk
    if cell in expected:
        return expected[cell]
    diff = parse_cell_id(cell)
    return merge(base, diff) if base else diff


def cell_row(results: Path, cell: str, expected: dict, base: dict | None, protocol: str | None = None) -> dict | None:
    """One cell's parameters, status (ok | fail | missing) and every metric found (its detection
    metrics under detect.protocols' ``protocol`` when one is named)."""
    try:
        parse_cell_id(cell)
    except ConfigError:
        return None  # not a cell folder
    out = CellOutputs.read(results, cell, protocol)
    params = _params(cell, out.stated_pretrain, expected, base)
    summary, probe, det = out.summary or Summary(), out.probe or ProbeRecord(), out.detect
    final = summary.last_epoch
    row = {
        "cell": cell,
        "group": group_id(cell),
        # diverged, or collapsed to a chance-level pretext loss (pipeline.pretrain)
        "status": "fail" if summary.failed else ("ok" if out.probe or det else "missing"),
        **{a: stated(params, a) for a in AXES},
        "params": params,
        "epochs_run": summary.epochs_run,
        "loss": final.loss,
        "inst_acc": final.inst_acc,
        # ||theta_k - theta_q|| / ||theta_q|| at the end, in percent (tables show one decimal)
        "drift": final.drift_percent,
        "bn_guard": summary.bn_guard,
        "probe_mode": probe.mode,
        "failure": summary.failed,
        "key_encoder": summary.key_encoder,
        # where its pretraining and its probe ran (pipeline.runtime.provenance); None: not recorded
        "provenance": [r.provenance for r in (out.summary, out.probe) if r is not None],
        **final.queue(),
        "top1": probe.top1,
        "top5": probe.top5,
        "knn_top1": probe.knn_top1,
        **{k: det and det.metric(k) for k in TRANSFER_KEYS},
        "det_setup": det and det.setup,
        "det_protocol": det and det.scored_as,
    }
    # each detection trial is one sample of the cell's group (the paper's mean over 5 VOC trials)
    trials = det.each_trial() if det else []
    row.update({f"{k}{SAMPLES}": [v for t in trials if (v := t.metric(k)) is not None] for k in TRANSFER_KEYS})
    return row


def collect(results: Path, expected: dict[str, dict] | None = None, protocol: str | None = None) -> pd.DataFrame:
    """One row per cell: those found under results/cells and those the grid expects (``protocol``:
    as cell_row)."""
    expected = expected or {}
    found = sorted(p.name for p in (results / "cells").glob("*") if p.is_dir())
    base = expected[BASE_ID] if BASE_ID in expected else CellOutputs.read(results, BASE_ID).stated_pretrain
    rows = [cell_row(results, c, expected, base, protocol) for c in dict.fromkeys([*expected, *found])]
    df = pd.DataFrame([r for r in rows if r is not None])
    if df.empty:
        return pd.DataFrame(columns=["cell", "group", "status", *AXES, "params", *METRICS])
    for m in METRICS:
        df[m] = pd.to_numeric(df[m], errors="coerce")
    return df


# --- groups of seeds -------------------------------------------------------------------------
@dataclass
class Value:
    """One table entry: mean and 95 % CI over the group's seeds that have the metric (a seed with
    several detection trials: their mean, so the CI is over seeds); the seeds that failed, and
    those without output, are counted, never averaged."""

    mean: float | None = None
    std: float | None = None
    n: int = 0  # seeds behind the mean
    failed: int = 0  # seeds whose pretraining failed (diverged or collapsed)
    by_seed: dict = field(default_factory=dict)  # seed -> its value (its trials' mean): for pairing
    failed_seeds: frozenset = frozenset()
    missing: int = 0  # seeds that neither failed nor have the metric (not run, or no output)

    @property
    def status(self) -> str:
        return "ok" if self.n else ("fail" if self.failed else "missing")

    @property
    def half(self) -> float | None:
        """Half-width of the 95 % CI of the mean (Student t; None for n < 2)."""
        return stats.ci_half_width(self.std, self.n)

    @property
    def estimate(self) -> stats.Estimate | None:
        return None if self.mean is None else stats.Estimate(self.mean, self.half, self.n, self.std)


def seed_of(cell: pd.Series) -> int:
    s = cell["seed"] if "seed" in cell else None
    return 0 if s is None or (isinstance(s, float) and math.isnan(s)) else int(s)


def value(cells: pd.DataFrame | None, metric: str) -> Value:
    """Mean, sample std and n over the group's seeds that did not fail (for detection, each
    seed's mean over its trials: trials of one seed are not independent samples), each seed's
    own value, the seeds that failed and the seeds without the metric."""
    if cells is None or cells.empty:
        return Value()

    def samples(c: pd.Series) -> list[float]:
        found = c[metric + SAMPLES] if metric + SAMPLES in cells else [c[metric] if metric in cells else None]
        return [float(v) for v in found if v is not None and not pd.isna(v)]

    # a failed pretraining fails its probe; its fine-tuning only where one ran (a cell outside
    # detect.cells has no AP, failed or not)
    failing = [c for _, c in cells[cells["status"] == "fail"].iterrows()]
    failed = frozenset(seed_of(c) for c in failing if metric not in TRANSFER_KEYS or samples(c))
    by_seed, missing = {}, len(failing) - len(failed)
    for _, c in cells[cells["status"] != "fail"].iterrows():
        if found := samples(c):
            by_seed[seed_of(c)] = sum(found) / len(found)
        else:
            missing += 1
    if not by_seed:
        return Value(failed=len(failed), failed_seeds=failed, missing=missing)
    e = stats.estimate(by_seed.values())
    assert e is not None  # by_seed is not empty
    return Value(e.mean, e.std, e.n, len(failed), by_seed, failed, missing)


@dataclass
class Delta:
    """A row's paired difference from its table's reference: seed s minus the reference's seed s,
    over the seeds both ran without failing; ``failed`` of the ``pairs`` seeds both ran failed
    on either side (not averaged)."""

    estimate: stats.Estimate | None
    pairs: int
    failed: int


def delta(v: Value, ref: Value) -> Delta | None:
    """Paired Δ of a row's value against the reference's (None when either was not computed)."""
    if v.status == "missing" or ref.status == "missing":
        return None
    seeds = (v.by_seed.keys() | v.failed_seeds) & (ref.by_seed.keys() | ref.failed_seeds)
    failed = len(seeds & (v.failed_seeds | ref.failed_seeds))
    return Delta(stats.paired(v.by_seed, ref.by_seed), len(seeds), failed)


@dataclass
class Group:
    id: str
    diff: dict  # axes that differ from the base, seed excluded
    params: dict
    cells: pd.DataFrame

    def stated(self, key: str):
        """A parameter as the group's config states it; None where it states none (its
        ``pretrain`` gives the value it ran with)."""
        return stated(self.params, key)

    @property
    def is_moco(self) -> bool:
        """A MoCo variant, as its config states the method (stating none: no)."""
        return is_moco(self.stated("method"))

    @functools.cached_property
    def pretrain(self) -> Pretrain:
        """The group's parameters (a cell's config.json, as stated) typed, keys it does not
        set at their defaults."""
        return section("pretrain", self.params)


def find(groups: Mapping[Any, Group], key: Hashable) -> Group | None:
    """The group under ``key`` (an id, or a study's own key), None where there is none."""
    return groups.get(key)


def groups(df: pd.DataFrame) -> dict[str, Group]:
    out = {}
    for gid, cells in df.groupby("group", sort=False):
        out[gid] = Group(gid, parse_cell_id(gid), cells.iloc[0]["params"], cells)
    return out


# --- tables ----------------------------------------------------------------------------------
@dataclass
class Row:
    keys: list[str]
    values: list[Value]
    cells: list[str] = field(default_factory=list)
    # per paired-Δ column of the table (Table.compared, in order): the row's Δ, and whether the
    # row is that column's reference
    deltas: list[Delta | None] = field(default_factory=list)
    reference: list[bool] = field(default_factory=list)


@dataclass
class Table:
    name: str  # file stem under results/tables
    title: str
    keys: list[str]  # headers of the key columns
    metrics: list[str]  # metric id of each value column (CSV names)
    columns: list[str]  # headers of the value columns
    rows: list[Row]
    provenance: str = ""
    groups: list[tuple[str, list[str]]] = field(default_factory=list)  # LaTeX: spanning header, short headers
    notes: list[str] = field(default_factory=list)  # footnotes of this table's own
    compared: list[tuple[str, str]] = field(default_factory=list)  # (metric, reference label) per paired-Δ column
    environment: str = ""  # where the runs behind it ran (pipeline.runtime.provenance)

    def decimals(self) -> list[int]:
        """Decimals shown for each value column."""
        return [DECIMALS[m] if m in DECIMALS else 1 for m in self.metrics]


METRIC_GROUPS = {
    "inst_acc": ("pretext", "instance"),
    "top1": ("top-1 accuracy", "linear"),
    "top5": ("top-5 accuracy", "linear"),
    "knn_top1": ("top-1 accuracy", "kNN"),
    **{k: ("detection", k) for k in ("AP50", "AP", "AP75", "APs", "APm", "APl")},
    **{f"mask_{k}": ("segmentation", k) for k in ("AP50", "AP", "AP75", "APs", "APm", "APl")},
    "drift": ("key encoder", "drift"),
    "queue_age_p99": ("queue", "p99 age"),
    "queue_age_max": ("queue", "max age"),
    "negative_drift_mean": ("negatives' drift", "mean"),
    "negative_drift_max": ("negatives' drift", "max"),
}


def column_groups(metrics) -> list[tuple[str, list[str]]]:
    """Consecutive metrics of one kind under one spanning header, as in the paper's tables."""
    out: list[tuple[str, list[str]]] = []
    for m in metrics:
        group, short = METRIC_GROUPS[m]
        if out and out[-1][0] == group:
            out[-1][1].append(short)
        else:
            out.append((group, [short]))
    return out


def _row(keys, group: Group | None, metrics) -> Row:
    cells = None if group is None else group.cells
    return Row(
        [str(k) for k in keys], [value(cells, m) for m in metrics], [] if group is None else list(group.cells["cell"])
    )


def _metric_table(name, title, keys, rows, metrics, prov) -> Table:
    return Table(name, title, keys, list(metrics), [METRICS[m] for m in metrics], rows, prov, column_groups(metrics))


def compare(table: Table, ref: Group | None | Sequence[Group | None], label: str, metric: str = "top1") -> Table:
    """Add a paired-Δ column: every row's ``metric`` against the reference group ``ref``
    (labelled ``label``; a sequence: each row's own), the row's seed s minus the reference's
    seed s. One column per metric."""
    if any(m == metric for m, _ in table.compared):
        raise ValueError(f"{table.name}: a second Δ column of {metric}")
    table.compared.append((metric, label))
    refs = list(ref) if isinstance(ref, Sequence) else [ref] * len(table.rows)
    i = table.metrics.index(metric)
    for row, of_row in zip(table.rows, refs):
        cells = None if of_row is None else of_row.cells
        ref_cells = set() if cells is None else set(cells["cell"])
        is_ref = bool(ref_cells) and set(row.cells) == ref_cells
        row.reference.append(is_ref)
        row.deltas.append(None if is_ref else delta(row.values[i], value(cells, metric)))
    return table


def differs(g: Group, reference: dict) -> set[str]:
    """The axes (seed aside) in which a group differs from a reference cell's differences."""
    return {a for a in {*g.diff, *reference} if a not in g.diff or a not in reference or g.diff[a] != reference[a]}


def one_axis(
    gs: dict[str, Group],
    axis: str,
    prov,
    name=None,
    title=None,
    fixed=(),
    metrics=ABLATION_METRICS,
    reference: str = BASE_ID,
) -> Table:
    """The reference cell (the base unless given) and the MoCo cells that differ from it in
    ``axis`` only, one row per value."""
    ref = parse_cell_id(reference)
    sel = {g.stated(axis): g for g in gs.values() if g.is_moco and differs(g, ref) <= {axis}}
    values = sorted({*sel, *fixed}, key=_sort_key)
    rows = [_row([format_value(v)], find(sel, v), metrics) for v in values]
    table = _metric_table(
        name or f"ablation_{axis}",
        title or f"Ablation over {axis}",
        [axis],
        rows,
        metrics,
        prov([g for g in sel.values()], vary={axis}),
    )
    return compare(table, find(gs, reference), reference)


def momentum(
    gs: dict[str, Group], prov, reference: str = BASE_ID, name: str = "ablation_m", metrics=(*ABLATION_METRICS, "drift")
) -> Table:
    """The momentum ablation (the paper's m rows), with each m's EMA half-life beside the
    queue's span K/B (how many steps its oldest key lags), and the final key-encoder drift;
    around the base cell, or around ``reference`` (the claims' shorter cell)."""
    title = "Ablation over the momentum m" + ("" if reference == BASE_ID else f" (around {reference})")
    table = one_axis(gs, "m", prov, name=name, title=title, fixed=PAPER_M, metrics=list(metrics), reference=reference)
    base = find(gs, reference)
    span = base and base.stated("K") and base.stated("batch_size") and base.stated("K") // base.stated("batch_size")
    table.keys = ["m", "EMA half-life (steps)", "queue span K/B (steps)"]
    for row in table.rows:
        life = half_life(float(row.keys[0]))
        shown = "∞" if math.isinf(life) else f"{life:,.0f}" if life >= 100 else f"{life:.3g}"
        row.keys += [shown, str(span) if span else "?"]
    return table


def shuffle_bn_groups(gs: dict[str, Group]) -> dict[bool, Group]:
    """shuffle_bn -> the base group and the MoCo group differing from it in shuffle_bn only."""
    return {g.pretrain.shuffle_bn: g for g in gs.values() if g.is_moco and set(g.diff) <= {"shuffle_bn"}}


def bn_leak(gs: dict[str, Group], prov) -> Table:
    """ShuffleBN on/off: the base cell and the cell differing from it in shuffle_bn only, with
    the pretext instance accuracy beside the probe (the leak's signature) and the guard used."""
    sel = shuffle_bn_groups(gs)
    rows = []
    for on in (True, False):
        g = find(sel, on)
        guard = "" if g is None else next((str(x) for x in g.cells["bn_guard"] if isinstance(x, str)), "")
        rows.append(_row([format_value(on), guard], g, BN_LEAK_METRICS))
    table = _metric_table(
        "shuffle_bn",
        "The BN leak: the ShuffleBN guard on and off (paper, 3.3)",
        ["shuffle_bn", "BN-leak guard"],
        rows,
        BN_LEAK_METRICS,
        prov(list(sel.values()), vary={"shuffle_bn"}),
    )
    return compare(table, find(sel, True), "guard on")


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def dictionary_size(p: Pretrain) -> int:
    """Negatives per query: the batch for end-to-end (Figure 3's x axis), K otherwise."""
    return p.batch_size if p.mechanism == "end_to_end" else p.K


def mechanism_groups(gs: dict[str, Group]) -> dict[tuple[str, int], Group]:
    """(mechanism, dictionary size) -> the closest-to-base group: MoCo v1/v2 cells that differ
    from the base in mechanism, K and batch size only."""
    out: dict[tuple[str, int], Group] = {}
    for g in sorted(gs.values(), key=lambda g: len(g.diff)):
        if g.is_moco and g.stated("variant") != "v3" and set(g.diff) <= {"mechanism", "K", "batch_size"}:
            out.setdefault((g.pretrain.mechanism, dictionary_size(g.pretrain)), g)
    return out


def mechanisms(gs: dict[str, Group], prov) -> Table:
    """The paper's Figure 3 as a table: rows K, one column per mechanism (linear, then kNN)."""
    sel = mechanism_groups(gs)
    sizes = sorted({k for _, k in sel})
    metrics, columns, rows = [], [], []
    for metric in ("top1", "knn_top1"):
        for mech, label in MECHANISMS.items():
            metrics.append(f"{mech}_{metric}")
            columns.append(f"{label} {METRICS[metric]}")
    for k in sizes:
        vals = [
            value(sel[(mech, k)].cells if (mech, k) in sel else None, metric)
            for metric in ("top1", "knn_top1")
            for mech in MECHANISMS
        ]
        cells = [c for mech in MECHANISMS if (mech, k) in sel for c in sel[(mech, k)].cells["cell"]]
        rows.append(Row([str(k)], vals, cells))
    return Table(
        "mechanisms",
        "Contrastive loss mechanisms over the number of negatives K (Figure 3)",
        ["K"],
        metrics,
        columns,
        rows,
        prov(list(sel.values()), vary={"mechanism", "K", "batch_size"}),
        [(METRICS[m], list(MECHANISMS.values())) for m in ("top1", "knn_top1")],
    )


# the axes a methods row names in its key columns (the backbone's label holds a ViT's geometry)
NAMED_IN_ROW = ("method", "variant", "backbone", "patch_size", "depth")


def method_groups(gs: dict[str, Group]) -> list[tuple[list[str], Group | None]]:
    """Rows of the method comparison: MoCo variants/backbones, then supervised, then random init.
    Keys: method, variant, backbone, other differences from the base."""
    picked = [
        g
        for g in gs.values()
        if "mechanism" not in g.diff and (g.id == BASE_ID or set(g.diff) & {"method", "variant", "backbone"})
    ]
    base = gs[BASE_ID].params if BASE_ID in gs else {}
    for fixed in (BASE_ID, SUPERVISED_ID, RANDOM_ID):
        if fixed not in gs:  # always a row, "—" until computed
            picked.append(Group(fixed, parse_cell_id(fixed), merge(base, parse_cell_id(fixed)), None))

    def key(g):
        return (
            row_order(g.pretrain.method),
            g.id != BASE_ID,
            str(g.stated("variant")),
            str(g.stated("backbone")),
            g.id,
        )

    rows = []
    for g in sorted(picked, key=key):
        method = g.diff["method"] if "method" in g.diff else g.stated("method") or "moco"
        label = "MoCo (base cell)" if g.id == BASE_ID else method_label(method)
        variant = (g.stated("variant") or "") if is_moco(method) else ""
        other = ", ".join(f"{a}={format_value(v)}" for a, v in g.diff.items() if a not in NAMED_IN_ROW)
        rows.append(([label, variant, backbone_label(g.params), other], g if g.cells is not None else None))
    return rows


# the keys that make two cells' backbones the same network (an untrained one is its own floor)
ARCHITECTURE = ("backbone", "width", "cifar_stem", "norm", "patch_size", "depth")


def random_init_of(gs: dict[str, Group], g: Group | None) -> Group | None:
    """The random-init group on ``g``'s backbone: each backbone's Δ is against its own untrained
    network (a ViT's random features are not a ResNet's). The main reference (method=random)
    where ``g`` is none, or no random init of its backbone ran."""
    main = find(gs, RANDOM_ID)
    if g is None:
        return main
    arch = {k: getattr(g.pretrain, k) for k in ARCHITECTURE}
    for other in gs.values():
        if other.pretrain.method == "random" and all(getattr(other.pretrain, k) == v for k, v in arch.items()):
            return other
    return main


def backbone_label(p: dict) -> str:
    """A backbone as the tables name it, from a cell's stated parameters."""
    backbone, width, patch, depth = (stated(p, k) for k in ("backbone", "width", "patch_size", "depth"))
    if not backbone:
        return ""
    name = BACKBONE_LABELS[backbone] if backbone in BACKBONE_LABELS else backbone
    if is_resnet(backbone) and width and width != 64:
        name += f" (width {width})"
    if is_vit(backbone) and patch:
        name += f"/{patch}"
    if is_vit(backbone) and depth:
        name += f" ({depth} blocks)"
    return name


def _methods_like(gs, prov, name, title, metrics) -> Table:
    picked = method_groups(gs)
    keys = ["method", "variant", "backbone", "other settings"]
    if not any(k[3] for k, _ in picked):
        keys, picked = keys[:3], [(k[:3], g) for k, g in picked]
    rows = [_row(k, g, metrics) for k, g in picked]
    return _metric_table(
        name,
        title,
        keys,
        rows,
        metrics,
        prov([g for _, g in picked if g is not None], vary={"method", "variant", "backbone"}),
    )


def supervised_note(recipe: dict) -> str:
    """How the supervised baseline was trained: its own recipe (grid.supervised's set keys) or
    the base cell's views, augmentation and schedule."""
    own = {k: v for k, v in recipe.items() if v is not None}
    if not own:
        return "supervised: trained on MoCo's views, augmentation and schedule (grid.supervised unset)."
    keys = ", ".join(f"{k}={format_value(v)}" for k, v in own.items())
    return f"supervised: its own recipe (grid.supervised: {keys}); other settings as the base cell."


def fine_tuned(gs: dict[str, Group]) -> bool:
    """Whether any cell went through detection transfer (its detect.json holds box AP)."""
    return any(g.cells is not None and g.cells["AP50"].notna().any() for g in gs.values())


def has_masks(gs: dict[str, Group]) -> bool:
    """Whether any cell was fine-tuned as a Mask R-CNN (its detect.json holds mask AP)."""
    return any(g.cells is not None and g.cells["mask_AP"].notna().any() for g in gs.values())


def methods_title(gs) -> str:
    """'MoCo vs supervised vs random init', with the rivals the grid ran between."""
    others = {g.pretrain.method for g in gs.values()} - {"moco", "supervised", "random"}
    rivals = [method_label(m) for m in sorted(others, key=row_order)]
    return " vs ".join(["MoCo", *rivals, "supervised", "random init"])


def methods(gs, prov, supervised_recipe: dict | None = None) -> Table:
    """The main table: each method with its paired Δ in linear top-1 against random init, a
    sentence on the base cell that states no direction its CI does not support, and how
    supervised trained. Where cells were fine-tuned, the AP columns' Δ against supervised, as
    the transfer tables and claim compare; mask AP columns join the box AP where a cell was
    fine-tuned for segmentation."""
    masks = has_masks(gs)
    metrics = ABLATION_METRICS + (MASK_METRICS if masks else [])
    table = _methods_like(gs, prov, "methods", methods_title(gs), metrics)
    if SUPERVISED_ID in gs:
        table.notes.append(supervised_note(supervised_recipe or {}))
    refs = [random_init_of(gs, g) for _, g in method_groups(gs)]
    compare(table, refs, RANDOM_LABEL)
    if len({id(r) for r in refs if r is not None}) > 1:
        table.notes.append(f"Δ vs {RANDOM_LABEL}: each row against random init of its own backbone, paired by seed.")
    if fine_tuned(gs):
        for metric in ["AP50", *(["mask_AP50"] if masks else [])]:
            compare(table, find(gs, SUPERVISED_ID), SUPERVISED_LABEL, metric=metric)
    base = next((r for r in table.rows if r.cells and BASE_ID in r.cells), None)
    if base is not None:
        table.notes.append(direction_sentence("MoCo (base cell)", RANDOM_LABEL, base.deltas[0], METRICS["top1"]))
        if SUPERVISED_ID in gs:  # the ceiling: MoCo's gap to labels, paired by seed as well
            top1 = base.values[table.metrics.index("top1")]
            gap = delta(top1, value(gs[SUPERVISED_ID].cells, "top1"))
            table.notes.append(direction_sentence("MoCo (base cell)", SUPERVISED_LABEL, gap, METRICS["top1"]))
    return table


def direction_sentence(row: str, ref: str, d: Delta | None, metric: str) -> str:
    """What a paired Δ says about the direction of a difference, and no more than its CI does."""
    if d is None or d.estimate is None:
        return f"{row} vs {ref}: no pair of seeds computed yet."
    verdict, why = stats.judge(d.estimate)  # no claim here: a side is only a direction
    failed = f"; {d.failed} of {d.pairs} seed pairs failed and are not in it" if d.failed else ""
    head = f"{row} − {ref}, {metric}, paired by seed: Δ {d.estimate.text(signed=True)}{failed}"
    if verdict == stats.HOLDS:
        return f"{head}: {row} is above {ref} on this data ({stats.ci_text(d.estimate)} excludes 0)."
    if verdict == stats.CONTRADICTED:
        return f"{head}: {row} is below {ref} on this data ({stats.ci_text(d.estimate)} excludes 0)."
    return f"{head}: these runs show no direction ({why})."


def detection(gs, prov) -> Table:
    """Box AP of each fine-tuned row; Δ in AP50 against supervised, paired by seed: the transfer
    claim's comparison (random init is not fine-tuned by default: a Δ against it would be empty)."""
    table = _methods_like(gs, prov, "detection", "Transfer to detection (box AP)", DETECTION_METRICS)
    return transfer_notes(compare(table, find(gs, SUPERVISED_ID), SUPERVISED_LABEL, metric="AP50"), gs)


def segmentation(gs, prov) -> Table:
    """Mask R-CNN transfer (detect.task: segmentation): box AP beside mask AP, as the paper's
    COCO table, each row's paired Δ in mask AP50 against supervised (the transfer claim's)."""
    title = "Transfer to instance segmentation (Mask R-CNN)"
    table = _methods_like(gs, prov, "segmentation", title, DETECTION_METRICS + MASK_METRICS)
    return transfer_notes(compare(table, find(gs, SUPERVISED_ID), SUPERVISED_LABEL, metric="mask_AP50"), gs)


def transfer_notes(table: Table, gs: dict[str, Group]) -> Table:
    """A transfer table's footnotes: the fine-tuning's normalisation and batch, the protocol."""
    for column, what in (("det_setup", "Fine-tuning normalisation and batch"), ("det_protocol", "Scored as")):
        note = per_row_note(table, gs, column)
        if note:
            table.notes.append(f"{what}: {note}.")
    return table


def per_row_note(table: Table, gs: dict[str, Group], column: str) -> str | None:
    """One value of ``column`` for the whole table, or each row's (rows named by their keys)."""
    cells = pd.concat([g.cells for g in gs.values()]) if gs else pd.DataFrame()
    by_row = {}
    for row in table.rows:
        found = cells[cells["cell"].isin(row.cells)] if row.cells and column in cells else pd.DataFrame()
        values = sorted({v for v in (found[column] if column in found else []) if isinstance(v, str)})
        if values:
            by_row[" ".join(k for k in row.keys if k)] = "; ".join(values)
    if len(set(by_row.values())) == 1:
        return next(iter(by_row.values()))
    return "; ".join(f"{row}: {v}" for row, v in by_row.items()) or None


def every_cell(gs, prov) -> Table:
    """Every group of the grid (product designs included), one row each."""
    order = sorted(gs.values(), key=lambda g: (g.id != BASE_ID, len(g.diff), g.id))
    rows = [_row([g.id], g, ABLATION_METRICS) for g in order]
    table = _metric_table(
        "grid", "Every cell of the grid", ["cell"], rows, ABLATION_METRICS, prov(order, vary=set(AXES))
    )
    return compare(table, find(gs, BASE_ID), BASE_ID)


# --- provenance ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stated:
    """The sections a table job's config states, typed (None: not given, e.g. python -m
    pipeline.tables without --config); ``pretrain`` as stated: the provenance names its keys."""

    dataset: Dataset | None = None
    probe: Probe | None = None
    detect: Detect | None = None
    pretrain: dict | None = None
    supervised: dict | None = None  # grid.supervised

    @classmethod
    def of(cls, cfg: dict) -> Stated:
        given = {k: v for k, v in cfg.items() if v is not None}
        grid = given["grid"] if "grid" in given else {}
        return cls(
            dataset=section("dataset", given["dataset"]) if "dataset" in given else None,
            probe=section("probe", given["probe"]) if "probe" in given else None,
            detect=section("detect", given["detect"]) if "detect" in given else None,
            pretrain=stated(given, "pretrain"),
            supervised=stated(grid, "supervised"),
        )


def dataset_text(ds: Dataset | None, results: Path) -> str:
    if ds and ds.source == "synthetic":
        s = ds.synthetic
        return (
            f"embedded synthetic shapes ({len(SYNTHETIC_CLASSES)} classes, {s.train_per_class} train / "
            f"{s.val_per_class} val images per class, {s.image_size} px)"
        )
    if ds and ds.root:
        return f"{ds.source} ({ds.root})"
    report = from_json(ConversionReport, read_json(results / "data" / "ffcv" / "train.json"))
    if report:
        return f"{report.source} ({report.num_samples} train images, {len(report.classes)} classes)"
    return "unknown (no dataset config or conversion report)"


def _epochs(n) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")


def recorded_probe(df: pd.DataFrame, results: Path) -> Probe | None:
    """The probe settings the first cell's probe.json records (one this version can read)."""
    for cell in df["cell"] if "cell" in df else []:
        record = CellOutputs.read(results, cell).probe
        try:
            if record and record.probe_config:
                return section("probe", record.probe_config)
        except ConfigError:
            continue  # written by a version with other probe keys
    return None


def protocol_text(stated: Stated, df: pd.DataFrame, results: Path) -> str:
    # python -m pipeline.tables without --config: the probe's own record
    probe = stated.probe or recorded_probe(df, results)
    how = f" ({probe.protocol} protocol, {probe.mode}, {_epochs(probe.epochs)})" if probe else ""
    knn = probe or Probe()
    text = f"linear probe on frozen features{how}; kNN top-1 (k={knn.knn_k}, T={knn.knn_t})"
    det = stated.detect
    if det is None:  # no config given: what every detection record shares
        return text + "; detection: {} fine-tuned, {}".format(*DETECTORS["detection"])
    if det.enabled:
        length = f"{det.iterations} iterations" if det.iterations else _epochs(det.epochs)
        norms = f"backbone {det.norm}, new layers {det.new_layers_norm}, lr {det.learning_rate:g}"
        how = ", ".join(x for x in (length, norms, det.trials > 1 and f"mean of {det.trials} trials") if x)
        head, (model, scores) = HEAD_LABELS[det.head], DETECTORS[det.task]
        text += f"; detection: {model} + {head} fine-tuned ({how}), {scores} on {det.root or 'the embedded scenes'}"
    return text


def _one_or_per_row(values, fmt=str) -> str:
    values = sorted({fmt(v) for v in values if v not in (None, "")})
    if not values:
        return "?"
    return values[0] if len(values) == 1 else "per row (" + ", ".join(values) + ")"


def provenance_factory(df: pd.DataFrame, cfg: dict, results: Path):
    """prov(groups, vary) -> the sentence every table carries: dataset, backbone, epochs, protocol."""
    stated = Stated.of(cfg)
    dataset, protocol = dataset_text(stated.dataset, results), protocol_text(stated, df, results)
    base = stated.pretrain
    if base is None and (df["cell"] == BASE_ID).any():
        base = df.loc[df["cell"] == BASE_ID, "params"].iloc[0]

    def prov(gs: list[Group], vary: set) -> str:
        ps = [g.params for g in gs if g is not None and g.params] or ([base] if base else [])
        moco = [p for p in ps if is_moco(p.get("method"))]
        same = [
            f"{a}={format_value(base[a])}"
            for a in ("variant", "K", "m", "T", "batch_size", "lr")
            if base and a in base and a not in vary
        ]
        fixed = f"; other parameters as the base cell ({', '.join(same)})" if same else ""
        return (
            f"dataset: {dataset}; backbone: {_one_or_per_row(ps, backbone_label)}; "
            f"pretraining: {_one_or_per_row([p.get('epochs') for p in (moco or ps)])} epochs{fixed}; "
            f"protocol: {protocol}"
        )

    return prov


def studies(df: pd.DataFrame, cfg: dict, results: Path) -> list[Table]:
    """The paper's tables, in order; then one table per other single-axis sweep found."""
    gs = groups(df)
    prov = provenance_factory(df, cfg, results)
    out = [
        methods(gs, prov, Stated.of(cfg).supervised),
        one_axis(gs, "K", prov, title="Ablation over the queue size K"),
        momentum(gs, prov, reference=momentum_reference(gs)),
        one_axis(gs, "epochs", prov, title="Ablation over the pretraining epochs"),
        mechanisms(gs, prov),
        bn_leak(gs, prov),
        detection(gs, prov),
        segmentation(gs, prov),
        every_cell(gs, prov),
    ]
    extra_axes = sorted({a for g in gs.values() if len(g.diff) == 1 for a in g.diff} - SEPARATE, key=AXES.index)
    return with_environment(out + [one_axis(gs, a, prov) for a in extra_axes], df)


def with_environment(tables: list[Table], df: pd.DataFrame) -> list[Table]:
    """Each table's footnote on where its runs ran: the provenance its cells recorded."""
    records = {} if df.empty else dict(zip(df["cell"], df["provenance"]))
    for t in tables:
        cells = dict.fromkeys(c for r in t.rows for c in r.cells)
        note = environment_note([rec for c in cells for rec in (records.get(c) or [])])
        t.environment = note or ""
    return tables
