"""What each claim of ``snakemake claims`` needs from its experiment, known before anything runs:
which cells (by role, pipeline.dag.grid.claims_overrides) and whether the configured budget can
decide it (enough steps for the EMA, a queue small enough for the data, two kNN checks for a
dip), from the training set's size (pipeline.dag.training_set) and the config alone.

Standard library only: pipeline.dag.grid uses it while Snakemake builds the DAG, to run
``claims.seeds`` seeds of the cells a decidable claim compares, ``claims.invariant_seeds`` of
those only an invariant needs, and none of the cells that only an undecidable claim would need.
The accuracy claims also rest on pilot runs (the reference and random init at
``claims.pilot_seeds`` further seeds, never compared): whether the reference learnt something is
read from them, not from the runs it judges. pipeline.claims states the same needs in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.base.layout import CLAIM_KEYS, QUEUE_POLICIES, is_vit
from pipeline.dag.sections import Claims

# "several EMA half-lives": after 5 the key encoder keeps 2^-5 = 3 % of its initial weights
HALF_LIVES = 5
# "K well below the training set": at most a tenth of it (the paper's 65,536 is 5 % of ImageNet),
# so that a queue holds at most a tenth of each class's images
QUEUE_SHARE = 0.1
LOW_M_AGAINST = 0.99  # "m < 0.99 loses": each m below it against m = 0.99
# SimCLR's large batch: this many times the base cell's (the MoCo v2 report compares 256 with
# 8,192); the same epochs, so the large batch takes that many times fewer steps, as in the report.
# The number of negatives alone: SimCLR at the base batch keeping 1 / LARGE_BATCH of its negatives
LARGE_BATCH = 4
# a collapse claim's source trained 300 epochs (BYOL, Table 5): a run without collapse contradicts
# it only at that length, in epochs of its own training set; a collapse shows at any length
COLLAPSE_SOURCE_EPOCHS = 300
# the patch-projection claim's larger lr: this many times the ViT cell's recipe lr (the MoCo v3
# paper's dips in kNN accuracy appear as the lr grows; at the recipe's lr alone there may be none)
LARGE_LR_FACTOR = 4
# the MoCo v3 ViT cells of the patch-projection claim: its patch projection frozen (random) and
# learned, at the recipe's lr and at LARGE_LR_FACTOR x it
VIT_ROLES = ("vit_frozen", "vit_learned", "vit_frozen_high", "vit_learned_high")


def half_life(m: float) -> float:
    """Steps after which the EMA weight of a query-encoder state has halved: ln 0.5 / ln m."""
    if m <= 0:
        return 0.0
    return math.inf if m >= 1 else math.log(0.5) / math.log(m)


PILOT_ROLES = ("pilot", "pilot_random")  # the reference and random init at the pilot seeds
ACCURACY_CLAIMS = (
    *("low_m", "larger_K", "slow_m", "longer", "memory_bank", "mlp_head", "aug_plus"),
    *("large_batch", "queue_vs_batch"),
)
# invariants hold when every run satisfies them: their own cells need only claims.invariant_seeds
INVARIANT_CLAIMS = ("fifo",)


@dataclass(frozen=True)
class Budget:
    """The size of the claims' experiment: training images, classes (None: not known before
    conversion), global batch, the reference's epochs, its momentum m and BYOL's target decay
    (its cells' recipe's tau)."""

    images: int
    classes: int | None
    batch: int
    epochs: int
    m: float
    byol_m: float

    @property
    def steps_per_epoch(self) -> int:
        """Optimisation steps per epoch (the pretraining loader drops the last partial batch)."""
        return self.images // self.batch

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def ema_steps(b: Budget, m: float) -> tuple[str, str | None]:
    """(needs, why not decidable or None): a run HALF_LIVES EMA half-lives of m long."""
    need = math.ceil(HALF_LIVES * half_life(m))
    text = f"≥ {need:,} steps ({HALF_LIVES} EMA half-lives of m = {m:g})"
    if b.steps >= need:
        return text, None
    epochs = math.ceil(need / max(b.steps_per_epoch, 1))
    return (
        text,
        f"needs ≥ {need:,} steps, has {b.steps:,}: claims.epochs ≥ {epochs:,} at {b.steps_per_epoch} steps/epoch",
    )


def small_queue(b: Budget, ks: list[int]) -> tuple[str, str | None]:
    """K well below the training set, so that the queue holds few same-class images."""
    limit = int(QUEUE_SHARE * b.images)
    per_class = ""
    if b.classes:
        per_class = f"; a queue then holds ≤ {limit / b.classes:,.0f} of a class's {b.images / b.classes:,.0f} images"
    text = f"K ≤ {limit:,} ({QUEUE_SHARE:.0%} of {b.images:,} training images{per_class})"
    too_large = [k for k in ks if k > limit]
    if not too_large:
        return text, None
    return text, f"needs K ≤ {limit:,}; K = {', '.join(f'{k:,}' for k in too_large)} too large for this data"


def fewer_negatives(batch: int) -> int:
    """The negatives SimCLR keeps in the negatives claim: 1 / LARGE_BATCH of a view's 2B - 2."""
    return (2 * batch - 2) // LARGE_BATCH


def negatives(b: Budget) -> tuple[str, str | None]:
    """SimCLR with all its in-batch negatives against SimCLR keeping 1 / LARGE_BATCH of them: the
    same batch, steps, lr and BN batch, so that only the number of negatives differs."""
    few = fewer_negatives(b.batch)
    text = f"{2 * b.batch - 2} against {few} negatives a view, both at batch {b.batch}, {b.steps:,} steps, the same lr"
    return text, None if few >= 1 else f"needs a batch of ≥ {LARGE_BATCH // 2 + 1} for a quarter of its negatives"


def large_batch(b: Budget, m: float) -> tuple[str, str | None]:
    """SimCLR at LARGE_BATCH x the base batch against MoCo's reference at the base batch: at
    least a step per epoch, and as many steps as the reference's EMA needs (HALF_LIVES half-lives
    of m), so that the comparison is of negatives, not of too short a run."""
    big = LARGE_BATCH * b.batch
    steps = b.images // big * b.epochs
    need = math.ceil(HALF_LIVES * half_life(m))
    text = (
        f"a batch of {big:,} ({LARGE_BATCH} x {b.batch}): {steps:,} steps in {b.epochs} epochs, "
        f"≥ {need:,} ({HALF_LIVES} EMA half-lives of the reference's m = {m:g})"
    )
    if b.images // big < 1:
        return text, f"needs ≥ {big:,} training images for one batch of {big:,}, has {b.images:,}"
    if steps < need:
        epochs = math.ceil(need / (b.images // big))
        return text, f"SimCLR at {big:,} has {steps:,} steps, needs ≥ {need:,}: claims.epochs ≥ {epochs:,}"
    return text, None


def collapse_length(b: Budget) -> tuple[str, str | None]:
    """A collapse shows at any length; its absence contradicts the source only at the source's
    length (COLLAPSE_SOURCE_EPOCHS): below it, a run that did not collapse decides nothing."""
    text = (
        f"≥ 2 seeds; holds at any length, contradicted only at ≥ {COLLAPSE_SOURCE_EPOCHS} epochs (the source's), "
        f"here {b.epochs}"
    )
    return text, None


def queue_turnover(b: Budget, ks: list[int]) -> tuple[str, str | None]:
    """The largest queue turned over twice, so that random replacement can keep older keys."""
    need = 2 * max(ks) // b.batch
    text = f"≥ {need:,} steps (the largest queue turned over twice)"
    return text, None if b.steps >= need else f"needs ≥ {need:,} steps, has {b.steps:,}"


def vit_cell(cells, base: dict) -> dict | None:
    """The first MoCo v3 ViT among ``cells`` (grid.cells: overrides of ``base``, a pretrain
    dict): the cell whose patch projection the claim varies; None where the grid has none."""

    def v3_vit(cell) -> bool:
        p = {**base, **cell}
        return p["method"] == "moco" and p["variant"] == "v3" and is_vit(p["backbone"])

    return next((dict(c) for c in cells if v3_vit(c)), None)


def knn_checks(b: Budget) -> tuple[str, str | None]:
    """A dip in the kNN monitor needs two checks of it to show: the ViT cells check it every
    epoch (knn_every 1), so the run needs at least 2 epochs."""
    text = f"≥ 2 kNN checks: the ViT cells check it every epoch, {b.epochs} epochs"
    return text, None if b.epochs >= 2 else f"needs claims.epochs ≥ 2 for two kNN checks, has {b.epochs}"


@dataclass(frozen=True)
class Need:
    roles: tuple[str, ...]  # the cells it needs (pipeline.dag.grid.claims_overrides' roles)
    text: str  # what the experiment must satisfy
    why_not: str | None  # why this budget cannot decide it (None: it can, as far as the config tells)


def needs(claims: Claims, b: Budget) -> dict[str, Need]:
    """Each claim's cells and a-priori needs, by claim key (pipeline.claims.CLAIMS' order)."""
    ks = sorted(claims.K)
    low = [m for m in claims.m if 0 < m < LOW_M_AGAINST]
    pilot = PILOT_ROLES if claims.pilot_seeds else ()  # every accuracy claim: the reference learnt
    out = {"fifo": Need(tuple(f"K={k},{p}" for k in ks for p in QUEUE_POLICIES), *queue_turnover(b, ks))}
    out["low_m"] = Need((*(f"m={m}" for m in low), f"m={LOW_M_AGAINST}", *pilot), *ema_steps(b, LOW_M_AGAINST))
    out["zero_m"] = Need(tuple(f"m={m}" for m in claims.m if m == 0) + ("random",), "≥ 2 seeds of each", None)
    out["larger_K"] = Need((*(f"K={k},fifo" for k in ks), *pilot), *small_queue(b, ks))
    out["slow_m"] = Need(("m=0.999", "m=0.9999", *pilot), *ema_steps(b, 0.9999))
    out["longer"] = Need(("long", "reference", *pilot), "", None)
    out["memory_bank"] = Need(("memory_bank", "reference", *pilot), "", None)
    # the MoCo v2 report's steps from v1, one at a time: the MLP head, then aug+ (the blur)
    out["mlp_head"] = Need(("reference", "v1_head", *pilot), "", None)
    out["aug_plus"] = Need(("reference", "no_blur", *pilot), "", None)
    out["patch_projection"] = Need(VIT_ROLES, *knn_checks(b))  # stability, not accuracy: no pilot
    # the rivals: SimCLR's batch against MoCo's queue, BYOL without negatives and its ablations
    out["large_batch"] = Need(("simclr", "simclr_few", *pilot), *negatives(b))
    out["queue_vs_batch"] = Need(("reference", "simclr_large", *pilot), *large_batch(b, b.m))
    out["byol_learns"] = Need(("byol", "random"), *ema_steps(b, b.byol_m))
    out["byol_predictor"] = Need(("byol_no_predictor", "random"), *collapse_length(b))
    out["byol_predictor_lars"] = Need(("byol_no_predictor_lars", "random"), *collapse_length(b))
    out["byol_ema"] = Need(("byol_no_ema", "random"), *collapse_length(b))
    assert tuple(out) == CLAIM_KEYS, "a claim added here is named in CLAIM_KEYS too"
    return out


def selected(claims: Claims) -> tuple[str, ...]:
    """The claims whose cells this run trains: ``claims.only``, else every one."""
    return CLAIM_KEYS if claims.only is None else tuple(claims.only)


def not_trained(claims: Claims, b: Budget) -> dict[str, str]:
    """claim key -> why this budget cannot decide it: its cells are not trained (no job starts).
    Only the claims this run trains (``claims.only``): the others' cells are not asked for."""
    chosen = selected(claims)
    return {key: n.why_not for key, n in needs(claims, b).items() if n.why_not and key in chosen}


COLLAPSE_CLAIMS = ("byol_predictor", "byol_predictor_lars", "byol_ema")


def one_sided(claims: Claims, b: Budget) -> dict[str, str]:
    """claim key -> why this budget decides it in one direction only: the collapse claims trained
    shorter than their source (they may hold; a run without collapse contradicts nothing)."""
    if b.epochs >= COLLAPSE_SOURCE_EPOCHS:
        return {}
    why = f"holds if every seed collapses; contradicted only at ≥ {COLLAPSE_SOURCE_EPOCHS} epochs, has {b.epochs}"
    return {key: why for key in COLLAPSE_CLAIMS if key in selected(claims)}


def role_seeds(claims: Claims, b: Budget, roles) -> dict[str, int]:
    """Seeds of each role: ``claims.seeds`` where a claim this budget can decide compares it (the
    pilot roles: ``claims.pilot_seeds``), ``claims.invariant_seeds`` where only an invariant
    needs it, 0 where only undecidable claims (or claims ``claims.only`` leaves out) would need it."""
    chosen = selected(claims)
    decidable = {key: n.roles for key, n in needs(claims, b).items() if n.why_not is None and key in chosen}
    compared = {r for key, rs in decidable.items() if key not in INVARIANT_CLAIMS for r in rs}
    invariant = {r for key, rs in decidable.items() if key in INVARIANT_CLAIMS for r in rs}

    def seeds(role: str) -> int:
        if role in compared:
            return claims.pilot_seeds if role in PILOT_ROLES else claims.seeds
        return claims.invariant_seeds if role in invariant else 0

    return {r: seeds(r) for r in roles}
