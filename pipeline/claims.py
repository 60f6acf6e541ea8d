"""The seeds' claims as experiments: one row per claim, with what was run, what the experiment
must satisfy to decide it, what was measured and the verdict the data support (``snakemake claims``).

Reads whatever exists under ``<results>/cells`` (a claim whose cells are missing is "not run"),
so it also renders after a partial run:

    python -m pipeline.claims results --config workflow/config/config.yaml

Writes ``<results>/tables/claims.{md,csv,tex}`` (the claims) and, as the studies behind them,
``claims_momentum`` (each m: EMA half-life, the queue's span K/B, drift, probe) and
``claims_queue`` (FIFO vs random replacement per K: key ages, negatives' drift, probe).

Each accuracy claim is a paired difference by seed (cell seed s − its comparison's seed s) with
its 95 % CI (pipeline.report.stats): ``holds`` when the CI excludes 0 on the claimed side,
``contradicted`` when it excludes 0 on the other side, ``inconclusive`` when it includes 0 (one
seed included); a claimed size is judged beside it (the ``size`` column). The patch-projection
claim pairs each run's largest dip of the kNN monitor in the same way. ``not decidable here
(...)`` when the experiment cannot decide it, known before it runs: a priori from the config (too
few steps for the EMA, a queue too large for the data: those cells are not trained), or from the
pilot runs (the reference and random init at seeds that are not compared) not having learnt
anything. Where a claim is about failure or loss, a failed run counts as the evidence it is.
An inconclusive comparison shows the smallest Δ its seeds can detect and the seeds that would
decide a Δ of the size observed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from pipeline.base.layout import MAIN_PROTOCOL, QUEUE_POLICIES, cell_file
from pipeline.dag.claims_plan import (
    COLLAPSE_SOURCE_EPOCHS,
    LARGE_BATCH,
    LARGE_LR_FACTOR,
    PILOT_ROLES,
    VIT_ROLES,
    fewer_negatives,
    needs,
)
from pipeline.dag.config import DEFAULT_CONFIG, ConfigError, detect_protocol, load_config, section, to_dict
from pipeline.dag.grid import (
    BASE_ID,
    budget_of,
    cell_id,
    claims_cells,
    claims_overrides,
    detects,
    format_value,
    grid_cells,
    group_id,
)
from pipeline.dag.sections import Claims, Config, Detect
from pipeline.dag.training_set import training_set
from pipeline.methods.section import Pretrain
from pipeline.report import stats
from pipeline.report.records import QUEUE_METRICS, read_json
from pipeline.report.stats import CONTRADICTED, HOLDS, INCONCLUSIVE, NOT_DECIDABLE
from pipeline.report.studies import (
    DETECTION_METRICS,
    MASK_METRICS,
    METRICS,
    SUPERVISED_ID,
    Group,
    Row,
    Table,
    Value,
    _metric_table,
    _row,
    collect,
    compare,
    delta,
    groups,
    momentum,
    provenance_factory,
    seed_of,
    value,
    with_environment,
)
from pipeline.report.writers import load_configs, markdown, results_folder, results_parser, write_table

NOT_RUN = "not run"
METRIC = "top1"  # what "helps" and "loses" are measured in: the linear probe's top-1
KNN_DROP = "knn_drop"  # what "more stable" is measured in: a run's largest dip of the kNN monitor
LOW_M_LOSS = 5.0  # the notes' "~5 points"


@dataclass
class Claim:
    text: str  # the claim, and what was run to test it
    source: str
    needs: str  # what the experiment must satisfy to decide it
    measured: str
    verdict: str
    cells: list[str]
    size: str = ""  # a claimed size against the CI (stats.judge_size)
    detectable: str = ""  # inconclusive: the smallest Δ these seeds can detect
    seeds: str = ""  # inconclusive: the seeds that would decide a Δ of the observed size
    # its paired tests: (p, the verdict each alone supports), the family Holm's correction reads
    tests: tuple[tuple[float, str], ...] = ()


class Cells:
    """The claims' cells by role (pipeline.dag.grid.claims_overrides), as groups of seeds, and the
    size of the experiment (steps, training images, classes). The pilot seeds' cells are kept
    apart: they decide whether the reference learnt something and are never compared. The ViT
    cells also carry their largest kNN dip (KNN_DROP, from their logs)."""

    def __init__(self, df: pd.DataFrame, cfg: Config, claims: Claims, results: Path, grid: pd.DataFrame | None = None):
        """``df``: the claims' cells; ``grid``: the main grid's, which only the transfer claim reads."""
        self.claims, base = claims, to_dict(cfg.pretrain)
        self.results = results  # the transfer-normalisation claim reads its protocols' files
        self.cfg = cfg  # the transfer claim reads the main grid's detection settings
        self.grid_gs = groups(df.iloc[:0] if grid is None else grid)
        self.overrides = claims_overrides(claims, cfg.pretrain, cfg.grid)
        self.ids = {role: group_id(cell_id(base, {**base, **o})) for role, o in self.overrides.items()}
        vits = {self.ids[r] for r in VIT_ROLES if r in self.ids}
        dips = [largest_knn_drop(results, cid) if gid in vits else None for cid, gid in zip(df["cell"], df["group"])]
        df = df.assign(**{KNN_DROP: dips})
        pilot_start = claims.seed(cfg.pretrain.seed) + claims.seeds
        self.pilot_seeds = range(pilot_start, pilot_start + claims.pilot_seeds)
        pilot = df.apply(seed_of, axis=1).isin(self.pilot_seeds) if not df.empty else pd.Series(dtype=bool)
        self.gs, self.pilot_gs = groups(df[~pilot]), groups(df[pilot])
        self.batch = cfg.pretrain.batch_size
        self.budget = budget_of(cfg, training_set(cfg, results))
        self.needs = needs(self.claims, self.budget)  # each claim's cells and a-priori needs

    def group(self, role: str) -> Group | None:
        return (self.pilot_gs if role in PILOT_ROLES else self.gs).get(self.ids[role])

    def cells(self, *roles) -> list[str]:
        return [c for r in roles if (g := self.group(r)) is not None for c in g.cells["cell"]]

    def value(self, role: str, metric: str = METRIC) -> Value:
        g = self.group(role)
        return value(None if g is None else g.cells, metric)

    def by_seed(self, role: str, key: str, failed_too: bool = False) -> dict[int, float]:
        """seed -> a cell's value of ``key`` (a metric or a last-epoch log value), the failed
        seeds' too when asked (their probe still ran: m = 0's direct measure)."""
        g = self.group(role)
        assert g is not None  # every caller's gate saw the role run; each cell row has every key
        rows = g.cells if failed_too else g.cells[g.cells["status"] != "fail"]
        vals = {seed_of(c): pd.to_numeric(c[key], errors="coerce") for _, c in rows.iterrows()}
        return {s: float(v) for s, v in vals.items() if not pd.isna(v)}

    def failures(self, role: str) -> dict[int, str]:
        """seed -> why its run failed (pipeline.pretrain.failure: "diverged: ..." or the
        method's "collapsed: ..."), for the failed seeds of ``role``."""
        g = self.group(role)
        assert g is not None  # every caller's gate saw the role run
        rows = g.cells[g.cells["status"] == "fail"]
        return {seed_of(c): str(c["failure"]) for _, c in rows.iterrows()}

    def ran(self, *roles) -> bool:
        return all(self.value(r).status != "missing" for r in roles)


def largest_knn_drop(results: Path, cell: str) -> float | None:
    """A run's largest drop of the kNN monitor between consecutive checks (points; 0 if it never
    drops), from its log.csv: the MoCo v3 paper's instability is such a dip, which the final
    accuracy can hide. None with fewer than two checks (no log, or no kNN column)."""
    try:
        log = pd.read_csv(cell_file(results, cell, "log"))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return None
    if "knn" not in log or "epoch" not in log:
        return None
    checks = pd.to_numeric(log.sort_values("epoch")["knn"], errors="coerce").dropna()
    if len(checks) < 2:
        return None
    return max(0.0, float((checks.shift() - checks).max()))


# --- decided before the data it judges --------------------------------------------------------
def _seeds(seeds: range) -> str:
    return f"seed {seeds.start}" if len(seeds) == 1 else f"seeds {seeds.start}–{seeds.stop - 1}"


def pilot_needs(c: Cells) -> str:
    if not c.claims.pilot_seeds:
        return "the reference learnt something: not checked (claims.pilot_seeds = 0)"
    return (
        f"the reference learnt something: its pilot runs ({_seeds(c.pilot_seeds)}, not compared) above "
        "random init at the same seeds, paired Δ's 95 % CI above 0"
    )


def pilot_gate(c: Cells) -> str | None:
    """Why the pilot runs say the accuracy claims cannot be decided, or None. They are the
    reference and random init at seeds no comparison uses, so the gate selects nothing on the
    data it judges; "learnt something" is their paired Δ vs random init excluding 0."""
    if not c.claims.pilot_seeds:
        return None
    d = delta(c.value("pilot"), c.value("pilot_random"))
    assert d is not None  # the gate saw both pilot roles run
    shown = "no pair" if d.estimate is None else d.estimate.text(signed=True)
    if d.failed:
        return f"pilot runs: {d.failed} of {d.pairs} failed (Δ vs random init {shown}): needs a longer or stabler run"
    verdict, why = stats.judge(d.estimate)
    if verdict == HOLDS:
        return None
    return f"pilot runs: the reference is not above random init (Δ {shown}, {why}): needs a longer run"


def undecidable(reason: str) -> str:
    return f"{NOT_DECIDABLE} ({reason})"


# --- comparisons ----------------------------------------------------------------------------------
@dataclass
class Comparison:
    label: str
    verdict: str
    text: str
    estimate: stats.Estimate | None = None
    size: str | None = None  # stats.judge_size against the claimed magnitude

    @property
    def p(self) -> float | None:
        """The paired t test's two-sided p (None without a spread, or after a failed run)."""
        return None if self.verdict == INCONCLUSIVE and "failed" in self.text else stats.p_value(self.estimate)


def failed_as_claimed(c: Cells, role: str) -> dict[int, float]:
    """seed -> the top-1 of each failed run of ``role``, where the claim is that it fails or
    loses: its probe (it still ran), else chance (a diverged run's encoder predicts nothing)."""
    probes = c.by_seed(role, METRIC, failed_too=True)
    chance = 100 / c.budget.classes if c.budget.classes else None
    found = {s: probes.get(s, chance) for s in c.value(role).failed_seeds}
    return {s: v for s, v in found.items() if v is not None}


def compare_roles(
    c: Cells,
    a: str,
    b: str,
    direction: int,
    magnitude: float | None = None,
    failure_is_loss: bool = False,
    metric: str = METRIC,
    label: str | None = None,
) -> Comparison:
    """Δ = a − b in ``metric`` (linear top-1), paired by seed; the claim: Δ has the sign of
    ``direction`` (a claimed size ``magnitude`` is judged beside it). A failed run of ``a`` counts
    at its probe when the claim is that ``a`` loses (``failure_is_loss``); any other failed run
    makes the comparison inconclusive, counted as k of n failed. ``label``: how the text names
    it (by default the two cells' ids)."""
    va, vb = c.value(a, metric), c.value(b, metric)
    label = label or f"{c.ids[a]} − {c.ids[b]}"
    counted = failed_as_claimed(c, a) if failure_is_loss and direction < 0 else {}
    pairs = (va.by_seed.keys() | va.failed_seeds) & (vb.by_seed.keys() | vb.failed_seeds)
    failed = len(pairs & ((va.failed_seeds - counted.keys()) | vb.failed_seeds))
    d = stats.paired({**va.by_seed, **counted}, vb.by_seed)
    shown = "no pair" if d is None else d.text(signed=True)
    as_claimed = len(pairs & counted.keys())
    note = f", {as_claimed} of {len(pairs)} failed as claimed (counted at their probe)" if as_claimed else ""
    if failed:
        return Comparison(label, INCONCLUSIVE, f"{label}: Δ {shown}, {failed} of {len(pairs)} seeds failed")
    verdict, why = stats.judge(d, direction)
    size = None if magnitude is None else stats.judge_size(d, direction, magnitude)
    return Comparison(label, verdict, f"{label}: Δ {shown}{note} ({why})", d, size)


def _per_comparison(comparisons: list[Comparison], text) -> str:
    """One column's entries, labelled when the claim has several comparisons; '—' when none says."""
    shown = [(x.label, t) for x in comparisons if (t := text(x))]
    if not shown:
        return "—"
    return shown[0][1] if len(comparisons) == 1 else "; ".join(f"{label}: {t}" for label, t in shown)


def detectable(x: Comparison) -> str | None:
    """An inconclusive comparison's smallest detectable Δ: its CI half-width (t · std / √n)."""
    e = x.estimate
    if x.verdict != INCONCLUSIVE or e is None:
        return None
    return "n = 1: no spread" if e.half is None else f"±{e.half:.1f} at n = {e.n}"


def seeds_needed(x: Comparison) -> str | None:
    """The seeds that would decide an inconclusive comparison's Δ of the observed size."""
    if x.verdict != INCONCLUSIVE or x.estimate is None:
        return None
    n = stats.seeds_to_decide(x.estimate)
    if n is None:
        return "≥ 2 to measure a spread" if x.estimate.half is None else f"> {stats.MAX_SEEDS:,}"
    return f"{n} for Δ {x.estimate.mean:+.1f}"


def accuracy_claim(text, source, needs, comparisons: list[Comparison], cells) -> Claim:
    return Claim(
        text,
        source,
        needs,
        "; ".join(x.text for x in comparisons),
        stats.combine([x.verdict for x in comparisons]),
        cells,
        _per_comparison(comparisons, lambda x: x.size),
        _per_comparison(comparisons, detectable),
        _per_comparison(comparisons, seeds_needed),
        tuple((p, x.verdict) for x in comparisons if (p := x.p) is not None),
    )


def gate(c: Cells, key: str) -> str | None:
    """The verdict claim ``key`` gets before its numbers: not decidable a priori (from the config:
    pipeline.dag.claims_plan; its cells were not trained), not run, or not decidable by the
    pilot runs (accuracy claims); None when the numbers decide it."""
    need = c.needs[key]
    if need.why_not:
        return undecidable(f"a priori: {need.why_not}")
    if not c.ran(*need.roles):
        return NOT_RUN
    if set(PILOT_ROLES) & set(need.roles):
        why = pilot_gate(c)
        if why:
            return undecidable(why)
    return None


# --- the claims -----------------------------------------------------------------------------------
SEED_NOTES = "seed 000 (MoCo notes)"
SEED_BLOG = "seed 002 (MoCo explainer)"
PAPER = "MoCo paper (He et al. 2020)"
PAPER_NORM = "MoCo paper, §4.2 Feature normalization"


def _epochs(c: Cells) -> str:
    steps = c.budget.steps
    return f"{c.claims.epochs} epochs ({'?' if steps is None else f'{steps:,}'} steps), {c.claims.seeds} seeds"


def _ks(ks) -> str:
    return " vs ".join(f"{k:,}" for k in ks)


def fifo_bound(c: Cells) -> Claim:
    ks = sorted(c.claims.K)
    roles = [f"K={k},{p}" for k in ks for p in QUEUE_POLICIES]
    text = (
        "FIFO bounds a negative's age at K/B steps; random replacement keeps older keys "
        f"(run: K = {_ks(ks)}, each FIFO and random, {_epochs(c)}; "
        f"a cell only this claim needs: {c.claims.invariant_seeds} seeds)"
    )
    needs = c.needs["fifo"].text
    verdict = gate(c, "fifo")
    if verdict:
        return Claim(text, SEED_NOTES, needs, "", verdict, c.cells(*roles))
    parts, fifo_ages, random_older = [], [], []  # per run: max age - K/B; an older key than K/B kept
    for k in ks:
        span = k // c.batch
        fifo, rand = (c.by_seed(f"K={k},{p}", "queue_age_max", failed_too=True) for p in QUEUE_POLICIES)
        fifo_ages += [age - span for age in fifo.values()]
        random_older += [age > span for age in rand.values()]
        ages = f"max age FIFO {_range(fifo)} ({len(fifo)} seeds), random {_range(rand)} ({len(rand)} seeds)"
        parts.append(f"K={k} (K/B={span}): {ages}")
    if any(excess > 0 for excess in fifo_ages):
        verdict = CONTRADICTED  # a FIFO key older than K/B steps: the bound is broken
    elif min(len(fifo_ages), len(random_older)) < 2:
        verdict = INCONCLUSIVE
    elif all(excess == 0 for excess in fifo_ages) and all(random_older):
        verdict = HOLDS
    else:
        verdict = CONTRADICTED if not any(random_older) else INCONCLUSIVE
    return Claim(text, SEED_NOTES, needs, "; ".join(parts), verdict, c.cells(*roles))


def _range(vals: dict) -> str:
    if not vals:
        return "?"
    lo, hi = min(vals.values()), max(vals.values())
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def low_momentum(c: Cells) -> Claim:
    low = [m for m in c.claims.m if 0 < m < 0.99]
    roles, against = [f"m={m}" for m in low], "m=0.99"
    text = (
        f"m < 0.99 loses accuracy (~{LOW_M_LOSS:g} points) (run: m = {', '.join(map(format_value, low))} "
        f"vs m = 0.99, {_epochs(c)})"
    )
    needs = f"{c.needs['low_m'].text}; {pilot_needs(c)}"
    cells = c.cells(*roles, against) if against in c.ids else []
    if not low or against not in c.ids:
        return Claim(text, SEED_NOTES, needs, "claims.m needs 0.99 and a value in (0, 0.99)", NOT_RUN, cells)
    verdict = gate(c, "low_m")
    if verdict:
        return Claim(text, SEED_NOTES, needs, "", verdict, cells)
    comparisons = [
        compare_roles(c, r, against, direction=-1, magnitude=LOW_M_LOSS, failure_is_loss=True) for r in roles
    ]
    return accuracy_claim(text, SEED_NOTES, needs, comparisons, cells)


def zero_momentum(c: Cells) -> Claim:
    text = f"m = 0 (the key encoder is the query encoder): training fails (run: m = 0, {_epochs(c)}; random init)"
    source = PAPER + ", §4.1 momentum ablation"
    margin = c.claims.random_init_margin
    needs = (
        "≥ 2 seeds of m = 0 and of random init. The direct measure is the probe − random init, paired by seed: "
        f"holds when its 95 % CI lies below +{margin:g} (at random init's level, claims.random_init_margin), "
        "or when every seed fails by the loss rule and the CI does not lie above 0; contradicted when the CI "
        f"lies above +{margin:g} and no seed failed"
    )
    role = next((f"m={m}" for m in c.claims.m if m == 0), None)
    if role is None:
        return Claim(text, source, needs, "claims.m has no 0", NOT_RUN, [])
    verdict = gate(c, "zero_m")
    if verdict:
        return Claim(text, source, needs, "", verdict, c.cells(role, "random"))
    v = c.value(role)
    runs, failed = v.n + v.failed, v.failed
    # the direct measure: the probe of every seed, failed ones included, against random init's
    d = stats.paired(c.by_seed(role, METRIC, failed_too=True), c.by_seed("random", METRIC))
    above, why = stats.judge(d)
    measured = (
        f"{failed} of {runs} seeds failed by the loss rule (diverged, or the loss at the method's chance); "
        f"probe − random init: Δ {'no pair' if d is None else d.text(signed=True)} ({why})"
    )
    cells = c.cells(role, "random")
    undecided = Comparison(f"{c.ids[role]} − {c.ids['random']}", INCONCLUSIVE, measured, d)
    if d is None or d.half is None:  # no interval: the columns say what would give one
        smallest, to_decide = (_per_comparison([undecided], f) for f in (detectable, seeds_needed))
        return Claim(text, source, needs, measured, INCONCLUSIVE, cells, "—", smallest, to_decide)
    failing = f"{failed} of {runs} did"
    if d.mean - d.half > margin:  # it learnt more than random init's level
        if failed == 0:
            return Claim(text, source, needs, measured, CONTRADICTED, cells, "—", "—", "—")
        what = f"no seed failing by the loss rule ({failing})"
    elif d.mean + d.half < margin or (failed == runs and above != HOLDS):
        return Claim(text, source, needs, measured, HOLDS, cells, "—", "—", "—")
    else:  # the CI reaches past the margin: more seeds of the probe, or every seed failing, decide
        seeds = stats.seeds_to_decide(d, margin) if d.mean < margin else None
        what = f"every seed failing by the loss rule ({failing})"
        if seeds is not None:
            what = f"{seeds} for the CI below +{margin:g} at Δ {d.mean:+.1f}, or {what}"
    return Claim(
        text, source, needs, measured, INCONCLUSIVE, cells, "—", _per_comparison([undecided], detectable), what
    )


def key_encoder(c: Cells) -> Claim:
    text = (
        "The key encoder never receives gradients and has no optimizer state; it is the EMA of the query encoder "
        "(checked in every trained claims run)"
    )
    records = [
        (cell, rec)
        for g in [*c.gs.values(), *c.pilot_gs.values()]
        if g.id in c.ids.values()
        for cell, rec in zip(g.cells["cell"], g.cells["key_encoder"])
        if isinstance(rec, dict)
    ]
    needs = "≥ 2 trained runs with a momentum encoder"
    if not records:
        return Claim(text, SEED_NOTES, needs, "", NOT_RUN, [])
    held = sum(bool(r["holds"]) for _, r in records)
    errors = [r["ema_replay"]["max_relative_error"] for _, r in records]
    grads = sum(
        r["key_parameters_with_grad"] + r["key_parameters_with_optimizer_state"] + r["key_parameters_in_optimizer"]
        for _, r in records
    )
    measured = (
        f"{held} of {len(records)} trained runs: key parameters in the optimizer, with state or with "
        f"gradients: {grads}; the last steps replayed as the EMA: max relative error {max(errors):.1e}"
    )
    verdict = CONTRADICTED if held < len(records) else HOLDS if len(records) >= 2 else INCONCLUSIVE
    return Claim(text, SEED_NOTES, needs, measured, verdict, [c for c, _ in records])


def larger_queue(c: Cells) -> Claim:
    ks = sorted(c.claims.K)
    roles = [f"K={k},fifo" for k in ks]
    text = f"A larger queue helps (the source: K from 1,024 to 65,536) (run: K = {_ks(ks)}, FIFO, {_epochs(c)})"
    needs = f"{c.needs['larger_K'].text}; {pilot_needs(c)}"
    if len(ks) < 2:
        return Claim(text, SEED_BLOG, needs, "claims.K has one value", NOT_RUN, c.cells(*roles))
    verdict = gate(c, "larger_K")
    if verdict:
        return Claim(text, SEED_BLOG, needs, "", verdict, c.cells(*roles))
    comparisons = [compare_roles(c, b, a, direction=1) for a, b in zip(roles, roles[1:])]
    return accuracy_claim(text, SEED_BLOG, needs, comparisons, c.cells(*roles))


def slow_momentum(c: Cells) -> Claim:
    text = f"m = 0.9999 is too slow: the key encoder barely moves (run: m = 0.9999 vs 0.999, {_epochs(c)})"
    roles = ["m=0.9999", "m=0.999"]
    needs = f"{c.needs['slow_m'].text}; {pilot_needs(c)}"
    if not {0.999, 0.9999} <= set(c.claims.m):
        return Claim(text, SEED_BLOG, needs, "claims.m lacks 0.999 or 0.9999", NOT_RUN, [])
    verdict = gate(c, "slow_m")
    if verdict:
        return Claim(text, SEED_BLOG, needs, "", verdict, c.cells(*roles))
    return accuracy_claim(text, SEED_BLOG, needs, [compare_roles(c, roles[0], roles[1], direction=-1)], c.cells(*roles))


def longer_schedule(c: Cells) -> Claim:
    e, le = c.claims.epochs, c.claims.long_epochs
    text = f"A longer schedule helps (the source: 200 vs 100 epochs) (run: {le} vs {e} epochs, {c.claims.seeds} seeds)"
    verdict = gate(c, "longer")
    if verdict:
        return Claim(text, SEED_BLOG, pilot_needs(c), "", verdict, c.cells("reference", "long"))
    comparison = compare_roles(c, "long", "reference", direction=1)
    return accuracy_claim(text, SEED_BLOG, pilot_needs(c), [comparison], c.cells("reference", "long"))


def memory_bank(c: Cells) -> Claim:
    text = f"A memory bank's stale keys do worse than MoCo's queue (run: same K, {_epochs(c)})"
    source = PAPER + ", Figure 3"
    verdict = gate(c, "memory_bank")
    if verdict:
        return Claim(text, source, pilot_needs(c), "", verdict, c.cells("reference", "memory_bank"))
    comparison = compare_roles(c, "memory_bank", "reference", direction=-1, failure_is_loss=True)
    return accuracy_claim(text, source, pilot_needs(c), [comparison], c.cells("reference", "memory_bank"))


TRANSFER_METRICS = DETECTION_METRICS + MASK_METRICS  # what the transfer claims compare


def transfer_gaps(cfg: Config) -> list[str]:
    """What the config lacks for the main grid to decide the transfer claim: MoCo's base cell
    and the supervised baseline, each fine-tuned as a Mask R-CNN, at >= 2 seeds."""
    det, grid, gaps = cfg.detect, cfg.grid, []
    if "supervised" not in grid.baselines:
        gaps.append("grid.baselines with supervised")
    if det.task != "segmentation":
        gaps.append("detect.task: segmentation")
    supervised = Pretrain(**{**to_dict(cfg.pretrain), "method": "supervised"})
    if not (detects(det, BASE_ID, cfg.pretrain) and detects(det, SUPERVISED_ID, supervised)):
        gaps.append(f"detect.cells with {BASE_ID} and {SUPERVISED_ID} (now {list(det.cells)}, enabled {det.enabled})")
    if grid.seeds < 2:
        gaps.append(f"grid.seeds ≥ 2 (now {grid.seeds})")
    if grid.only is not None and not {BASE_ID, SUPERVISED_ID} <= set(grid.only):
        gaps.append(f"grid.only with both (now {list(grid.only)})")
    return gaps


def transfer_cells(c: Cells) -> list[str]:
    """The main grid's cells the transfer claims read: MoCo's base cell and supervised, every seed."""
    groups = (c.grid_gs.get(gid) for gid in (BASE_ID, SUPERVISED_ID))
    return [cell for g in groups if g is not None for cell in g.cells["cell"]]


def transfer_comparison(c: Cells, metric: str) -> Comparison:
    """MoCo's base cell − supervised in one AP metric, paired by seed; a failed seed on either
    side makes it inconclusive (counted, not averaged)."""
    a, b = (g.cells if (g := c.grid_gs.get(gid)) is not None else None for gid in (BASE_ID, SUPERVISED_ID))
    d = delta(value(a, metric), value(b, metric))
    label = METRICS[metric]
    if d is None:
        return Comparison(label, INCONCLUSIVE, f"{label}: no result")
    shown = "no pair" if d.estimate is None else d.estimate.text(signed=True)
    if d.failed:
        return Comparison(label, INCONCLUSIVE, f"{label}: Δ {shown}, {d.failed} of {d.pairs} seeds failed")
    verdict, why = stats.judge(d.estimate, 1)
    return Comparison(label, verdict, f"{label}: Δ {shown} ({why})", d.estimate)


def transfer(c: Cells) -> Claim:
    text = (
        "MoCo matches or exceeds supervised on detection and segmentation transfer (run: the main grid's "
        f"base cell vs {SUPERVISED_ID}, each fine-tuned as a Mask R-CNN, box and mask AP, paired by seed)"
    )
    needs = (
        "the main grid (snakemake, not the claims' cells) with grid.baselines supervised, detect.task "
        "segmentation, detect.cells covering base and method=supervised, grid.seeds ≥ 2; a "
        "supervised baseline trained as its reference was (grid.supervised) for the paper's comparison"
    )
    cells = transfer_cells(c)
    gaps = transfer_gaps(c.cfg)
    if gaps:
        return Claim(text, SEED_BLOG, needs, "", undecidable("a priori: needs " + "; ".join(gaps)), cells)
    if any(
        g is None or value(g.cells, "mask_AP").status == "missing" for g in map(c.grid_gs.get, (BASE_ID, SUPERVISED_ID))
    ):
        return Claim(text, SEED_BLOG, needs, "snakemake (the main grid) computes them", NOT_RUN, cells)
    comparisons = [transfer_comparison(c, m) for m in TRANSFER_METRICS]
    return accuracy_claim(text, SEED_BLOG, needs, comparisons, cells)


def norm_protocols(det: Detect) -> tuple[str | None, str | None]:
    """(frozen, normalised): the detection protocols (MAIN_PROTOCOL or a detect.protocols name)
    that freeze BN with unnormalised new layers, and that train normalisation in the backbone
    and the new layers; None where the config runs none."""
    found = {MAIN_PROTOCOL: det, **{n: section("detect", detect_protocol(to_dict(det), n)) for n in det.protocols}}
    frozen = [n for n, d in found.items() if d.norm == "frozen_bn" and d.new_layers_norm == "none"]
    trained = [n for n, d in found.items() if d.norm != "frozen_bn" and d.new_layers_norm != "none"]
    return (frozen or [None])[0], (trained or [None])[0]


def protocol_by_seed(c: Cells, gid: str, protocol: str) -> dict[str, dict[int, float]]:
    """metric -> seed -> a cell group's value under a detection protocol (its trials' mean, as
    detect.json holds it), the seeds whose pretraining failed left out; each file read once."""
    g = c.grid_gs.get(gid)
    if g is None:
        return {m: {} for m in TRANSFER_METRICS}
    if protocol == MAIN_PROTOCOL:
        return {m: dict(value(g.cells, m).by_seed) for m in TRANSFER_METRICS}
    found: dict[str, dict[int, float]] = {m: {} for m in TRANSFER_METRICS}
    for _, cell in g.cells[g.cells["status"] != "fail"].iterrows():
        record = read_json(Path(cell_file(c.results, cell["cell"], "protocol").format(protocol=protocol))) or {}
        for m in TRANSFER_METRICS:
            if record.get(m) is not None:
                found[m][seed_of(cell)] = float(record[m])
    return found


def transfer_norm(c: Cells) -> Claim:
    frozen, trained = norm_protocols(c.cfg.detect)
    text = (
        "Frozen BN with unnormalised new layers leaves MoCo further behind supervised than the paper's "
        "feature normalisation (BN trained in the backbone and the new layers) (run: the main grid's base cell "
        f"and {SUPERVISED_ID}, each checkpoint fine-tuned under both protocols, paired by seed)"
    )
    needs = (
        "the transfer claim's needs, and both protocols among detect's own and detect.protocols (one with "
        "norm frozen_bn and head_norm none, one training norm and head_norm); Δ = (MoCo − supervised) under "
        "the normalised protocol − the same under frozen BN, per seed: holds when its 95 % CI lies above 0"
    )
    cells = transfer_cells(c)
    wanted = (("frozen BN", frozen), ("trained normalisation", trained))
    gaps = transfer_gaps(c.cfg) + [f"a detection protocol with {what}" for what, name in wanted if name is None]
    if gaps:
        return Claim(text, PAPER_NORM, needs, "", undecidable("a priori: needs " + "; ".join(gaps)), cells)
    assert frozen is not None and trained is not None
    comparisons = []
    read = {(p, gid): protocol_by_seed(c, gid, p) for p in (trained, frozen) for gid in (BASE_ID, SUPERVISED_ID)}
    for metric in TRANSFER_METRICS:
        gap = {}
        for protocol in (trained, frozen):
            moco, sup = (read[protocol, gid][metric] for gid in (BASE_ID, SUPERVISED_ID))
            gap[protocol] = {s: moco[s] - sup[s] for s in moco.keys() & sup.keys()}
        d = stats.paired(gap[trained], gap[frozen])
        label = METRICS[metric]
        if d is None:
            comparisons.append(Comparison(label, INCONCLUSIVE, f"{label}: no seed under both protocols"))
            continue
        verdict, why = stats.judge(d, 1)
        comparisons.append(Comparison(label, verdict, f"{label}: Δ {d.text(signed=True)} ({why})", d))
    if all(x.estimate is None for x in comparisons):
        return Claim(text, PAPER_NORM, needs, "snakemake (the main grid) computes them", NOT_RUN, cells)
    return accuracy_claim(text, PAPER_NORM, needs, comparisons, cells)


# --- the MoCo v2 report's steps from v1, and MoCo v3's ViT ------------------------------------------
REPORT = "MoCo v2 report (Chen et al. 2020), Table 1"
V3_PAPER = "MoCo v3 paper (Chen, Xie and He 2021), §4.2 and its stability figures"


def v2_step(c: Cells, key: str, role: str, text: str, absent: str) -> Claim:
    """A step of the MoCo v2 report from v1, undone alone: the reference (v2) − ``role`` (v2
    without the step), paired by seed; the claim: the step helps. An accuracy claim: the pilot
    gates it. ``absent``: why there is no such cell (a base cell without the step)."""
    if role not in c.ids:
        return Claim(text, REPORT, pilot_needs(c), absent, NOT_RUN, [])
    cells = c.cells("reference", role)
    verdict = gate(c, key)
    if verdict:
        return Claim(text, REPORT, pilot_needs(c), "", verdict, cells)
    comparison = compare_roles(c, "reference", role, direction=1)
    return accuracy_claim(text, REPORT, pilot_needs(c), [comparison], cells)


def mlp_head(c: Cells) -> Claim:
    text = (
        "An MLP projection head helps (the source: v1's linear head 60.6 → 66.2 with a 2-layer MLP head, "
        f"200 epochs) (run: the reference (v2) vs variant v1, its linear head and nothing else, {_epochs(c)})"
    )
    absent = f"the base cell has no MLP head to take away (variant {c.cfg.pretrain.variant})"
    return v2_step(c, "mlp_head", "v1_head", text, absent)


def aug_plus(c: Cells) -> Claim:
    text = (
        "Gaussian blur added to the augmentation helps: aug+ (the source: MLP head 66.2 → 67.3 with aug+, whose "
        "colour jitter was also stronger; here only the blur differs) (run: the reference (v2) vs aug cifar, "
        f"v2's augmentation without its blur, {_epochs(c)})"
    )
    absent = f"the base cell's augmentation has no blur to take away (aug {c.cfg.pretrain.aug})"
    return v2_step(c, "aug_plus", "no_blur", text, absent)


def patch_projection(c: Cells) -> Claim:
    text = (
        "A frozen random patch projection makes ViT training more stable than a learned one: the learned one's "
        "kNN accuracy dips at a larger lr"
    )
    needs = (
        f"{c.needs['patch_projection'].text}. The measure, fixed before the runs: per run, the largest drop of "
        "the kNN monitor between consecutive epochs (points; 0 if it never drops), from its pretrain/log.csv; a "
        f"diverged run counts as failed, never as a drop. Holds when at {LARGE_LR_FACTOR} x the lr the paired Δ "
        "learned − frozen of the largest drop has its 95 % CI above 0, contradicted when below 0; the same Δ at "
        "the recipe's lr and the probe's Δ frozen − learned at both are reported beside it"
    )
    if "vit_frozen" not in c.ids:
        why = "grid.cells has no MoCo v3 ViT cell (e.g. {variant: v3, backbone: vit_tiny, patch_size: 8, depth: 4})"
        return Claim(text, V3_PAPER, needs, why, NOT_RUN, [])
    high = c.overrides["vit_frozen_high"]["lr"]
    vit = c.overrides["vit_frozen"]
    shape = ", ".join(f"{k} {vit[k]}" for k in ("backbone", "patch_size", "depth") if k in vit)
    text += (
        f" (run: the grid's MoCo v3 ViT ({shape}), its patch projection frozen vs learned, at its recipe's lr "
        f"{high / LARGE_LR_FACTOR:g} and at {LARGE_LR_FACTOR} x it, {_epochs(c)}, the kNN monitor every epoch)"
    )
    cells = c.cells(*VIT_ROLES)
    verdict = gate(c, "patch_projection")
    if verdict:
        return Claim(text, V3_PAPER, needs, "", verdict, cells)
    lrs = {"_high": high, "": high / LARGE_LR_FACTOR}  # VIT_ROLES' suffixes: the larger lr, the recipe's
    dips = [
        compare_roles(
            c, f"vit_learned{s}", f"vit_frozen{s}", 1, metric=KNN_DROP, label=f"kNN drop learned − frozen at lr {lr:g}"
        )
        for s, lr in lrs.items()
    ]
    probes = [
        compare_roles(c, f"vit_frozen{s}", f"vit_learned{s}", 1, label=f"probe frozen − learned at lr {lr:g}")
        for s, lr in lrs.items()
    ]
    claim = accuracy_claim(text, V3_PAPER, needs, dips[:1], cells)  # the larger lr alone decides
    return replace(claim, measured="; ".join(x.text for x in dips + probes))


# --- the rivals: SimCLR's batch against MoCo's queue, BYOL without negatives ----------------------

EQUIVALENCE = stats.EQUIVALENCE_MARGIN  # "matches": the paired Δ's 90 % CI inside ±5 points


def large_batch(c: Cells) -> Claim:
    few, full = fewer_negatives(c.batch), 2 * c.batch - 2
    text = (
        f"In-batch negatives need a large batch; here its number of negatives alone: SimCLR keeping all "
        f"{full} of a view's negatives beats SimCLR keeping {few} (1 / {LARGE_BATCH}), at this recipe and "
        f"budget (run: both at batch {c.batch}, {_epochs(c)}, the same lr 0.3 x B/256 and BN batch)"
    )
    needs = f"{c.needs['large_batch'].text}; {pilot_needs(c)}"
    roles = ("simclr", "simclr_few")
    verdict = gate(c, "large_batch")
    if verdict:
        return Claim(text, SEED_NOTES, needs, "", verdict, c.cells(*roles))
    comparison = compare_roles(c, *roles, direction=1)
    return accuracy_claim(text, SEED_NOTES, needs, [comparison], c.cells(*roles))


def queue_vs_batch(c: Cells) -> Claim:
    big = LARGE_BATCH * c.batch
    text = (
        f"MoCo's queue at batch {c.batch} matches SimCLR at {big:,} (the MoCo v2 report: 67.5 at 256 against "
        f"66.6 at 8,192), at this recipe and budget (run: the reference, {c.budget.steps:,} steps, K = "
        f"{c.cfg.pretrain.K:,} negatives, vs SimCLR at {big:,}, {c.budget.images // big * c.claims.epochs:,} steps, "
        f"{2 * big - 2:,} negatives; {_epochs(c)})"
    )
    needs = f"{c.needs['queue_vs_batch'].text}; the paired Δ's 90 % CI inside ±{EQUIVALENCE:g}; {pilot_needs(c)}"
    roles = ("reference", "simclr_large")
    verdict = gate(c, "queue_vs_batch")
    if verdict:
        return Claim(text, SEED_NOTES, needs, "", verdict, c.cells(*roles))
    x = compare_roles(c, *roles, direction=1)
    if x.estimate is None or x.verdict == INCONCLUSIVE and "failed" in x.text:
        return Claim(text, SEED_NOTES, needs, x.text, INCONCLUSIVE, c.cells(*roles))
    verdict, why = stats.equivalent(x.estimate, EQUIVALENCE)
    measured = f"{x.label}: Δ {x.estimate.text(signed=True)} ({why})"
    undecided = ("—", *to_match(x.estimate)) if verdict == INCONCLUSIVE else ("", "", "")
    p = stats.equivalence_p(x.estimate, EQUIVALENCE)
    tests = () if p is None else ((p, verdict),)
    return Claim(text, SEED_NOTES, needs, measured, verdict, c.cells(*roles), *undecided, tests=tests)


def to_match(d: stats.Estimate) -> tuple[str, str]:
    """An undecided equivalence's columns: its 90 % CI's half-width, and the seeds that would
    decide it at the observed Δ and spread (stats.seeds_to_match)."""
    interval = stats.equivalence_interval(d)
    if interval is None:
        return "n = 1: no spread", "≥ 2 to measure a spread"
    half = (interval[1] - interval[0]) / 2
    n = stats.seeds_to_match(d, EQUIVALENCE)
    inside = abs(d.mean) < EQUIVALENCE
    goal = f"the 90 % CI inside ±{EQUIVALENCE:g}" if inside else f"the 95 % CI outside ±{EQUIVALENCE:g}"
    seeds = f"> {stats.MAX_SEEDS:,}" if n is None else str(n)
    return f"±{half:.1f} (90 % CI) at n = {d.n}", f"{seeds} for {goal} at Δ {d.mean:+.1f}"


def byol_learns(c: Cells) -> Claim:
    text = (
        "BYOL learns without negatives: above random init, at this recipe and budget "
        f"(run: BYOL, grid.byol's recipe, {_epochs(c)}; random init)"
    )
    verdict = gate(c, "byol_learns")
    roles = ("byol", "random")
    if verdict:
        return Claim(text, SEED_BLOG, c.needs["byol_learns"].text, "", verdict, c.cells(*roles))
    comparison = compare_roles(c, *roles, direction=1)
    return accuracy_claim(text, SEED_BLOG, c.needs["byol_learns"].text, [comparison], c.cells(*roles))


def collapse_claim(c: Cells, role: str, key: str, text: str, source: str, readings: tuple[str, str]) -> Claim:
    """A claim that an ablation of BYOL collapses: holds when every seed collapses by BYOL's own
    rule (its outputs' spread below the floor); contradicted when none does and its probe lies
    above random init's (paired Δ's 95 % CI above 0), and only by runs as long as the source's
    (COLLAPSE_SOURCE_EPOCHS): a shorter run without collapse decides nothing; inconclusive
    otherwise. A diverged run (loss not finite) is a failure, never a collapse: with one, the
    claim is inconclusive. ``readings``: what each outcome says (holds, contradicted)."""
    needs = (
        f"{c.needs[key].text}; holds when every seed collapses by BYOL's rule (the spread of its outputs below "
        "its floor; a diverged run is no collapse), contradicted when none does and its probe lies above "
        "random init's"
    )
    verdict = gate(c, key)
    if verdict:
        return Claim(text, source, needs, "", verdict, c.cells(role, "random"))
    v, failures = c.value(role), c.failures(role)
    collapsed = sum(why.startswith("collapsed") for why in failures.values())
    diverged = len(failures) - collapsed
    runs = v.n + v.failed
    d = stats.paired(c.by_seed(role, METRIC, failed_too=True), c.by_seed("random", METRIC))
    above, why = stats.judge(d)
    measured = (
        f"{collapsed} of {runs} seeds collapsed"
        + (f", {diverged} diverged (failed, not collapsed)" if diverged else "")
        + f"; probe − random init: Δ {'no pair' if d is None else d.text(signed=True)} ({why})"
    )
    long_enough = c.claims.epochs >= COLLAPSE_SOURCE_EPOCHS
    if runs >= 2 and collapsed == runs:
        verdict, reading = HOLDS, readings[0]
    elif runs >= 2 and v.failed == 0 and above == HOLDS and long_enough:
        verdict, reading = CONTRADICTED, readings[1]
    else:
        undecided = Comparison(f"{c.ids[role]} − {c.ids['random']}", INCONCLUSIVE, measured, d)
        short = "" if long_enough else f", shorter than the source's {COLLAPSE_SOURCE_EPOCHS} epochs"
        cols = (_per_comparison([undecided], detectable), undecided_collapse(d, v.failed, runs, long_enough))
        return Claim(
            text,
            source,
            needs,
            f"{measured}: neither reading{short}",
            INCONCLUSIVE,
            c.cells(role, "random"),
            "—",
            *cols,
        )
    return Claim(text, source, needs, f"{measured}: {reading}", verdict, c.cells(role, "random"))


def undecided_collapse(d: stats.Estimate | None, failed: int, runs: int, long_enough: bool = True) -> str:
    """What more seeds could decide of an undecided collapse claim: only the "none collapses and
    it learns" reading can be reached by adding seeds, and only in runs as long as the source's,
    while none has failed and its Δ over random init is positive; every seed collapsing cannot be
    planned for."""
    if failed:
        return f"— ({failed} of {runs} failed: neither reading at any n)"
    if not long_enough:
        return f"— (no seed count: a run without collapse decides only at ≥ {COLLAPSE_SOURCE_EPOCHS} epochs)"
    if d is None or d.mean <= 0:
        return "— (none collapsed and its Δ over random init is not above 0)"
    n = stats.seeds_to_decide(d)
    shown = f"> {stats.MAX_SEEDS:,}" if n is None else str(n)
    return f"{shown} for the CI above 0 at Δ {d.mean:+.1f}, if none collapses"


PREDICTOR_READINGS = ("the predictor is what keeps it apart", "it learnt without the predictor")


def byol_predictor(c: Cells) -> Claim:
    text = (
        "BYOL without its predictor collapses (BYOL paper; SimSiam: 0.1 %), under the embedded recipe "
        f"(SGD, grid.byol) (run: predictor=false, {_epochs(c)})"
    )
    return collapse_claim(c, "byol_no_predictor", "byol_predictor", text, "BYOL paper, Table 5b", PREDICTOR_READINGS)


def byol_predictor_lars(c: Cells) -> Claim:
    rule = c.overrides["byol_no_predictor_lars"]
    text = (
        "BYOL without its predictor collapses (BYOL paper), under the paper's recipe (LARS, lr "
        f"{rule['lr']:g}, weight decay {rule['weight_decay']:g}) (run: predictor=false, {_epochs(c)})"
    )
    key = "byol_predictor_lars"
    return collapse_claim(c, "byol_no_predictor_lars", key, text, "BYOL paper, Table 5b", PREDICTOR_READINGS)


def byol_ema(c: Cells) -> Claim:
    text = (
        "BYOL without the EMA (tau = 0) collapses, as the BYOL paper reports (0.3 %); SimSiam says a "
        f"stop-gradient and a predictor suffice (run: m = 0, {_epochs(c)})"
    )
    readings = ("the BYOL paper's reading", "SimSiam's reading: no EMA needed")
    return collapse_claim(c, "byol_no_ema", "byol_ema", text, "BYOL paper, Table 5a; SimSiam", readings)


CLAIMS = [
    fifo_bound,
    low_momentum,
    zero_momentum,
    key_encoder,
    larger_queue,
    slow_momentum,
    longer_schedule,
    memory_bank,
    transfer,
    transfer_norm,
    mlp_head,
    aug_plus,
    patch_projection,
    large_batch,
    queue_vs_batch,
    byol_learns,
    byol_predictor,
    byol_predictor_lars,
    byol_ema,
]


# --- tables -------------------------------------------------------------------------------------
def claims_table(c: Cells, prov) -> Table:
    rows = [claim(c) for claim in CLAIMS]
    e, le = c.claims.epochs, c.claims.long_epochs
    steps = c.budget.steps
    budget = f"{e} epochs = {steps:,} steps of batch {c.batch}" if steps is not None else f"{e} epochs"
    cannot = [r.text.split(" (")[0] for r in rows if r.verdict.startswith(NOT_DECIDABLE)]
    notes = [
        f"Cells: the base cell trained {e} epochs (the schedule claim: {le}), varied one setting at a time, "
        f"{c.claims.seeds} seeds each (claims.seeds), and random init; accuracy is the linear probe's top-1 "
        "(the transfer claim: box and mask AP of the main grid's base and supervised cells; it holds only "
        "where MoCo's CI lies above supervised: a CI including 0 cannot tell matching from trailing). The MoCo "
        "v2 report's steps: the reference (v2) against v1's linear head and against v2's augmentation without "
        "its blur. The patch projection: the grid's MoCo v3 ViT, frozen against learned, each run's largest "
        f"drop of the kNN monitor between consecutive epochs, at {LARGE_LR_FACTOR} x its recipe's lr.",
        "Δ a − b: a's seed s minus b's seed s, mean ± 95 % CI (Student t) over the n seeds both ran. "
        "The direction decides the verdict: holds: the CI excludes 0 on the claimed side; contradicted: it "
        "excludes 0 on the other side; inconclusive: it includes 0, or one seed. size: a claimed size against "
        "the CI (consistent with the size: the CI contains it; smaller / larger than claimed: the CI lies "
        "entirely below / above it). Failures: where the claim is that a setting fails or loses (m = 0, "
        "m < 0.99, the memory bank), its failed runs are that evidence, counted at their probe (chance "
        "if none); elsewhere a failed run is counted (k of n seeds failed) and the comparison is "
        "inconclusive. The invariants (FIFO bound, key encoder) hold when every run satisfies them (≥ 2 runs).",
        "What would decide an inconclusive comparison: smallest detectable Δ: its CI's half-width, "
        "t(0.975, n − 1) · sd / √n at these n seeds and their spread; seeds to decide: the smallest n with "
        "t(0.975, n − 1) · sd / √n < |Δ| at the observed Δ and spread (an equivalence: with t(0.95, n − 1) "
        "and the distance from Δ to the nearer margin; a collapse claim: for the probe's CI above 0, while "
        "no seed has collapsed).",
        f"not decidable here: the experiment cannot decide the claim (the needs column; the reason says what "
        f"would), known before the runs it judges: 'a priori' from the config (those cells are not trained), "
        f"or from the pilot runs (other seeds than the compared ones). This budget ({budget}, "
        f"{c.claims.seeds} seeds) cannot decide: " + ("; ".join(cannot) if cannot else "none of them") + ".",
        multiplicity(rows),
        "not run: a cell the claim needs has no result yet (snakemake claims computes them"
        + ("" if c.claims.only is None else f"; this run's claims.only: {', '.join(c.claims.only)}")
        + ").",
    ]
    return Table(
        "claims",
        "The seeds' claims, measured",
        ["claim", "source", "needs", "measured", "verdict", "size", "smallest detectable Δ", "seeds to decide"],
        [],
        [],
        [
            Row(
                [r.text, r.source, r.needs, r.measured or "—", r.verdict, r.size or "—", r.detectable or "—"]
                + [r.seeds or "—"],
                [],
                r.cells,
            )
            for r in rows
        ],
        prov([g for g in (c.group(r) for r in c.ids) if g is not None], vary=set()),
        notes=notes,
    )


def short_name(r: Claim) -> str:
    """A claim's statement without what was run."""
    return r.text.split(" (")[0].split(":")[0].split(";")[0]


def multiplicity(rows: list[Claim]) -> str:
    """The family of paired tests behind the claims, each read at 5 %, and which decided verdicts
    stay decided under Holm's correction (family-wise 5 %): a verdict survives when every test
    that supports it rejects."""
    tests = [(r, p, v) for r in rows for p, v in r.tests]
    rejected = stats.holm([p for _, p, _ in tests])
    decided = [r for r in rows if r.verdict in (HOLDS, CONTRADICTED) and r.tests]
    survive = {
        id(r): all(rej for (owner, _, v), rej in zip(tests, rejected) if owner is r and v == r.verdict) for r in decided
    }
    kept = [short_name(r) for r in decided if survive[id(r)]]
    lost = [short_name(r) for r in decided if not survive[id(r)]]
    return (
        f"Multiplicity: {len(tests)} paired tests behind {len({id(r) for r, _, _ in tests})} claims, each read at "
        f"5 %. Under Holm's correction (family-wise 5 %), of the {len(decided)} decided verdicts "
        + (f"these stay decided: {'; '.join(kept)}" if kept else "none stays decided")
        + (f"; these do not: {'; '.join(lost)}." if lost else ".")
    )


def queue_table(c: Cells, prov) -> Table:
    metrics = [*QUEUE_METRICS, "top1", "knn_top1"]
    rows = []
    for k in c.claims.K:
        rows += [
            _row([str(k), policy, str(k // c.batch)], c.group(f"K={k},{policy}"), metrics) for policy in QUEUE_POLICIES
        ]
    roles = [f"K={k},{p}" for k in c.claims.K for p in QUEUE_POLICIES]
    table = _metric_table(
        "claims_queue",
        "FIFO vs random replacement: the age of the queue's keys and how far "
        "the key encoder moved since they were encoded",
        ["K", "queue policy", "K/B (steps)"],
        rows,
        metrics,
        prov([c.group(r) for r in roles if c.group(r)], vary={"K", "queue_policy"}),
    )
    table.notes.append(
        "Ages and drifts at the end of training; drift = ||θk(now) − θk(when encoded)|| / "
        "||θk(now)|| over the keys in the queue (a count sketch of the parameters, ~2% error)."
    )
    return compare(table, c.group("reference"), c.ids["reference"])


def claims_tables(df: pd.DataFrame, grid: pd.DataFrame, cfg: dict, results: Path) -> list[Table]:
    """``df``: the claims' cells; ``grid``: the main grid's (the transfer claim); ``cfg``: the
    config as the job's JSON states it (the tables' provenance names its keys)."""
    typed = load_config(cfg)
    assert typed.claims is not None  # run() refuses a config without it, with the message
    c = Cells(df, typed, typed.claims, results, grid)
    # the tables rest on pretraining and the probe; only the transfer claim reads detection
    prov = provenance_factory(df, {**cfg, "detect": {"enabled": False}}, results)
    mom = momentum(
        c.gs,
        prov,
        reference=c.ids["reference"],
        name="claims_momentum",
        metrics=["top1", "knn_top1", "drift", "negative_drift_mean"],
    )
    return with_environment([claims_table(c, prov), mom, queue_table(c, prov)], df)


def run(results: Path, cfg: dict) -> str:
    """Write the claims tables from whatever cells exist; returns them (Markdown)."""
    if not cfg.get("claims") or not cfg.get("pretrain"):
        raise ConfigError("the claims tables need the config's pretrain and claims sections")
    typed = load_config(cfg)
    # every claim's cells, claims.only or not: it picks what a run trains; the table reads
    # whatever the folder holds of the others (else they stay `not run`)
    every_claim = replace(typed, claims=replace(typed.claims, only=None)) if typed.claims else typed
    expected = {cid: cell.stated(cfg["pretrain"]) for cid, cell in claims_cells(every_claim).items()}
    # only this config's cells: another claims run's seeds in the same folder (another
    # first_seed) must never enter a verdict fixed before them; the main grid's apart (transfer)
    df = collect(results, expected)
    grid = df[df["cell"].isin(grid_cells(typed).keys())]
    tables = claims_tables(df[df["cell"].isin(expected.keys())], grid, cfg, results)
    for t in tables:
        write_table(t, results / "tables")
    return "\n".join(markdown(t) for t in tables)


def main(argv=None) -> None:
    ap = results_parser(
        __doc__, "workflow config with pretrain, grid and claims (file or inline JSON; repeat to overlay)"
    )
    args = ap.parse_args(argv)
    results = results_folder(args.results, "claims")
    try:
        print(run(results, load_configs(args.config or [str(DEFAULT_CONFIG)])))
    except ConfigError as err:
        sys.exit(f"[claims] {err}")


if __name__ == "__main__":
    main()
