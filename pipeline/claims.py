"""The seeds' claims as experiments: one row per claim, with what was measured here and whether
the claim's direction holds on this data (``snakemake claims``).

Reads whatever exists under ``<results>/cells`` (a claim whose cells are missing is "not run"),
so it also renders after a partial run:

    python -m pipeline.claims results --config workflow/config/config.yaml

Writes ``<results>/tables/claims.{md,csv,tex}`` (the claims) and, as the studies behind them,
``claims_momentum`` (each m: EMA half-life, the queue's span K/B, drift, probe) and
``claims_queue`` (FIFO vs random replacement per K: key ages, negatives' drift, probe).
A claim is judged by the direction of the difference only; with one seed per cell there is no
noise estimate, which the table's footnote says.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.config import DEFAULT_CONFIG, ConfigError, merge, section
from pipeline.grid import cell_id, claims_cells, claims_overrides, format_value, group_id
from pipeline.layout import QUEUE_POLICIES
from pipeline.studies import (
    QUEUE_METRICS,
    Group,
    Row,
    Table,
    Value,
    _metric_table,
    _row,
    collect,
    groups,
    momentum,
    provenance_factory,
    value,
)
from pipeline.tables import load_configs, markdown, results_folder, results_parser, write_table

HOLDS, FAILS, NOT_RUN = "holds", "does not hold", "not run"
METRIC = "top1"  # what "helps" and "loses" are measured in: the linear probe's top-1


@dataclass
class Claim:
    text: str
    source: str
    measured: str
    verdict: str
    cells: list[str]


class Cells:
    """The claims' cells by role (pipeline.grid.claims_overrides), as groups of seeds."""

    def __init__(self, df: pd.DataFrame, cfg: dict):
        self.gs = groups(df)
        base = cfg["pretrain"]
        self.claims, typed_base = section("claims", cfg["claims"]), section("pretrain", base)
        self.ids = {
            role: group_id(cell_id(base, merge(base, o)))
            for role, o in claims_overrides(self.claims, typed_base).items()
        }
        self.batch = typed_base.batch_size

    def group(self, role: str) -> Group | None:
        return self.gs.get(self.ids[role])

    def cells(self, *roles) -> list[str]:
        return [c for r in roles if (g := self.group(r)) is not None for c in g.cells["cell"]]

    def top1(self, role: str) -> Value:
        g = self.group(role)
        return value(None if g is None else g.cells, METRIC)

    def final(self, role: str, key: str) -> float | None:
        """A last-epoch log value (queue ages, drifts), mean over the group's seeds."""
        g = self.group(role)
        if g is None or key not in g.cells:
            return None
        vals = pd.to_numeric(g.cells[key], errors="coerce").dropna()
        return float(vals.mean()) if len(vals) else None

    def failure(self, role: str) -> str | None:
        g = self.group(role)
        found = [] if g is None else [f for f in g.cells["failure"] if isinstance(f, str)]
        return found[0] if found else None

    def shown(self, role: str) -> str:
        """The role's top-1, or "fail" with why (pretrain.failure)."""
        v, why = self.top1(role), self.failure(role)
        return f"{pct(v)} ({why})" if v.status == "fail" and why else pct(v)


def pct(v: Value) -> str:
    return "fail" if v.status == "fail" else "—" if v.mean is None else f"{v.mean:.1f}"


def ran(*values: Value) -> bool:
    return all(v.status != "missing" for v in values)


def verdict(holds: bool) -> str:
    return HOLDS if holds else FAILS


def worst_if_missing(v: Value) -> float:
    """The mean top-1, -inf where there is none (so that max() never picks it)."""
    return -math.inf if v.mean is None else v.mean


def better(a: Value, b: Value) -> bool:
    """a beats b in linear top-1 (a failed run beats nothing; anything beats a failed run)."""
    if a.status == "fail":
        return False
    return b.status == "fail" or (a.mean is not None and b.mean is not None and a.mean > b.mean)


# --- the claims ---------------------------------------------------------------------------------
SEED_NOTES = "seed 000 (MoCo notes)"
SEED_BLOG = "seed 002 (MoCo explainer)"
PAPER = "MoCo paper (He et al. 2020)"


def fifo_bound(c: Cells) -> Claim:
    roles = [f"K={k},{p}" for k in c.claims.K for p in QUEUE_POLICIES]
    text = "FIFO bounds a negative's age at K/B steps; random replacement keeps arbitrarily old keys"
    if not all(c.group(r) is not None and c.final(r, "queue_age_max") is not None for r in roles):
        return Claim(text, SEED_NOTES, "", NOT_RUN, c.cells(*roles))
    parts, holds = [], True
    for k in c.claims.K:
        span = k // c.batch
        fifo, rand = (c.final(f"K={k},{p}", "queue_age_max") for p in QUEUE_POLICIES)
        drift = [c.final(f"K={k},{p}", "negative_drift_max") for p in QUEUE_POLICIES]
        holds &= fifo == span and rand > span
        parts.append(
            f"K={k} (K/B={span}): max age FIFO {fifo:.0f}, random {rand:.0f}; negatives' max drift "
            f"{_num(drift[0])}% vs {_num(drift[1])}%; top-1 "
            f"{pct(c.top1(f'K={k},fifo'))} vs {pct(c.top1(f'K={k},random'))}"
        )
    return Claim(text, SEED_NOTES, "; ".join(parts), verdict(holds), c.cells(*roles))


def _num(x: float | None) -> str:
    return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def low_momentum(c: Cells) -> Claim:
    low = [m for m in c.claims.m if 0 < m < 0.99]
    high = [m for m in c.claims.m if m in (0.99, 0.999)]
    roles = [f"m={m}" for m in low + high]
    text = "m < 0.99 loses accuracy (~5 points): at m = 0.5 the key encoder's half-life is ~1 step"
    vals = {m: c.top1(f"m={m}") for m in low + high}
    if not low or not high or not ran(*vals.values()):
        return Claim(text, SEED_NOTES, "", NOT_RUN, c.cells(*roles))
    best = max(high, key=lambda m: worst_if_missing(vals[m]))
    gaps = ", ".join(f"m={format_value(m)}: {c.shown(f'm={m}')}" for m in low)
    holds = all(better(vals[best], vals[m]) for m in low)
    return Claim(
        text, SEED_NOTES, f"top-1 {gaps} vs m={format_value(best)}: {pct(vals[best])}", verdict(holds), c.cells(*roles)
    )


def zero_momentum(c: Cells) -> Claim:
    text = "m = 0 (the key encoder is the query encoder): training fails"
    role = next((f"m={m}" for m in c.claims.m if m == 0), None)
    if role is None or not ran(c.top1(role)):
        return Claim(text, PAPER + ", §4.1 momentum ablation", "", NOT_RUN, c.cells(role) if role else [])
    failure = c.failure(role)
    measured = failure or f"trained without failing: top-1 {pct(c.top1(role))}"
    return Claim(text, PAPER + ", §4.1 momentum ablation", measured, verdict(failure is not None), c.cells(role))


def key_encoder(c: Cells) -> Claim:
    text = "The key encoder never receives gradients and has no optimizer state; it is the EMA of the query encoder"
    records = [
        (cell, rec)
        for g in c.gs.values()
        if g.id in c.ids.values()
        for cell, rec in zip(g.cells["cell"], g.cells["key_encoder"])
        if isinstance(rec, dict)
    ]
    if not records:
        return Claim(text, SEED_NOTES, "", NOT_RUN, [])
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
    return Claim(text, SEED_NOTES, measured, verdict(held == len(records)), [c for c, _ in records])


def larger_queue(c: Cells) -> Claim:
    ks = sorted(c.claims.K)
    roles = [f"K={k},fifo" for k in ks]
    text = "A larger queue helps (K from 1024 to 65,536 steadily improves accuracy)"
    vals = [c.top1(r) for r in roles]
    if len(ks) < 2 or not ran(*vals):
        return Claim(text, SEED_BLOG, "", NOT_RUN, c.cells(*roles))
    holds = all(better(b, a) for a, b in zip(vals, vals[1:]))
    measured = "top-1 " + ", ".join(f"K={k}: {pct(v)}" for k, v in zip(ks, vals))
    return Claim(text, SEED_BLOG, measured, verdict(holds), c.cells(*roles))


def slow_momentum(c: Cells) -> Claim:
    text = "m = 0.9999 is too slow: the key encoder barely moves (worse than m = 0.999)"
    if not {0.999, 0.9999} <= set(c.claims.m):
        return Claim(text, SEED_BLOG, "", NOT_RUN, [])
    fast, slow = c.top1("m=0.999"), c.top1("m=0.9999")
    if not ran(fast, slow):
        return Claim(text, SEED_BLOG, "", NOT_RUN, c.cells("m=0.999", "m=0.9999"))
    return Claim(
        text,
        SEED_BLOG,
        f"top-1 m=0.9999: {pct(slow)} vs m=0.999: {pct(fast)}",
        verdict(better(fast, slow)),
        c.cells("m=0.999", "m=0.9999"),
    )


def longer_schedule(c: Cells) -> Claim:
    text = "A longer schedule helps (200 epochs work much better than 100)"
    short, long = c.top1("reference"), c.top1("long")
    cells = c.cells("reference", "long")
    if not ran(short, long):
        return Claim(text, SEED_BLOG, "", NOT_RUN, cells)
    e, le = c.claims.epochs, c.claims.long_epochs
    return Claim(
        text,
        SEED_BLOG,
        f"top-1 {le} epochs: {pct(long)} vs {e} epochs: {pct(short)}",
        verdict(better(long, short)),
        cells,
    )


def memory_bank(c: Cells) -> Claim:
    text = "A memory bank's stale keys do worse than MoCo's queue (same K)"
    moco, bank = c.top1("reference"), c.top1("memory_bank")
    cells = c.cells("reference", "memory_bank")
    if not ran(moco, bank):
        return Claim(text, PAPER + ", Figure 3", "", NOT_RUN, cells)
    return Claim(
        text,
        PAPER + ", Figure 3",
        f"top-1 MoCo: {pct(moco)} vs memory bank: {c.shown('memory_bank')}",
        verdict(better(moco, bank)),
        cells,
    )


CLAIMS = [
    fifo_bound,
    low_momentum,
    zero_momentum,
    key_encoder,
    larger_queue,
    slow_momentum,
    longer_schedule,
    memory_bank,
]


# --- tables -------------------------------------------------------------------------------------
def claims_table(c: Cells, cfg: dict, prov) -> Table:
    rows = [claim(c) for claim in CLAIMS]
    e, le = c.claims.epochs, c.claims.long_epochs
    seeds = section("grid", cfg.get("grid")).seeds
    notes = [
        f"Cells: the base cell trained {e} epochs (the schedule claim: {le}), varied one setting at a "
        f"time; {seeds} seed{'s' * (seeds > 1)} per cell; accuracy is the linear probe's top-1.",
        "holds / does not hold: the direction of the measured difference only. "
        + (
            "With one seed per cell the noise is unknown: differences of a point or two may be seed noise."
            if seeds == 1
            else "Means over the seeds; compare the differences with the ± of claims_momentum."
        ),
        "not run: a cell the claim needs has no result yet (snakemake claims computes them).",
    ]
    return Table(
        "claims",
        "The seeds' claims, measured",
        ["claim", "source", "measured", "verdict"],
        [],
        [],
        [Row([r.text, r.source, r.measured or "—", r.verdict], [], r.cells) for r in rows],
        prov([g for g in (c.group(r) for r in c.ids) if g is not None], vary=set()),
        notes=notes,
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
    return table


def claims_tables(df: pd.DataFrame, cfg: dict, results: Path) -> list[Table]:
    c = Cells(df, cfg)
    prov = provenance_factory(df, cfg, results)
    mom = momentum(
        c.gs,
        prov,
        reference=c.ids["reference"],
        name="claims_momentum",
        metrics=["top1", "knn_top1", "drift", "negative_drift_mean"],
    )
    return [claims_table(c, cfg, prov), mom, queue_table(c, prov)]


def run(results: Path, cfg: dict) -> str:
    """Write the claims tables from whatever cells exist; returns them (Markdown)."""
    if not cfg.get("claims") or not cfg.get("pretrain"):
        raise ConfigError("the claims tables need the config's pretrain and claims sections")
    cfg = {**cfg, "detect": {"enabled": False}}  # the claims rest on pretraining and the probe only
    tables = claims_tables(collect(results, claims_cells(cfg)), cfg, results)
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
