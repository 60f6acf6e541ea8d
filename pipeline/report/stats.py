"""The statistics behind every table: means with 95 % confidence intervals (Student t), paired
differences by seed, and the verdict a difference supports.

Standard library only (no scipy): the t quantile comes from the exact CDF of Student's t for
an integer number of degrees of freedom (Abramowitz & Stegun 26.7.3-4), inverted by bisection.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LEVEL = 0.95  # every interval of the tables
HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"
NOT_DECIDABLE = "not decidable here"
# a claimed size, judged beside the direction's verdict (never instead of it)
SIZE_CONSISTENT, SIZE_SMALLER, SIZE_LARGER = "consistent with the size", "smaller than claimed", "larger than claimed"
MAX_SEEDS = 10_000  # seeds_to_decide looks no further


def _t_central(t: float, dof: int) -> float:
    """P(|T| <= t) for Student's t with ``dof`` (a positive integer) degrees of freedom."""
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    term = total = 1.0
    if dof % 2:  # odd: (2/pi)(theta + sin cos [1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...])
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (s * math.cos(theta) * total if dof > 1 else 0.0))
    for k in range(1, dof // 2):  # even: sin [1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...]
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(p: float, dof: int) -> float:
    """The p quantile of Student's t (0.5 < p < 1), e.g. t_quantile(0.975, 2) = 4.303."""
    if not 0.5 < p < 1 or dof < 1 or int(dof) != dof:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and an integer dof >= 1 (got p={p}, dof={dof})")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while _t_central(hi, dof) < target:
        hi *= 2
    for _ in range(200):  # bisection to the float's resolution
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _t_central(mid, dof) < target else (lo, mid)
    return (lo + hi) / 2


def ci_half_width(std: float | None, n: int) -> float | None:
    """Half-width of the 95 % CI of a mean of n values with sample std ``std`` (None for n < 2)."""
    if std is None or n < 2:
        return None
    return t_quantile(0.5 + LEVEL / 2, n - 1) * std / math.sqrt(n)


@dataclass(frozen=True)
class Estimate:
    """A mean over n values and the half-width of its 95 % CI (None when n = 1)."""

    mean: float
    half: float | None
    n: int
    std: float | None = None  # the sample std behind ``half`` (what more seeds would narrow)

    def text(self, decimals: int = 1, signed: bool = False, extra: str = "") -> str:
        """'+3.2 ± 1.1 (n=3)'; '3.2 (n=1)' without an interval; ``extra`` goes inside the brackets."""
        mean = f"{self.mean:+.{decimals}f}" if signed else f"{self.mean:.{decimals}f}"
        return mean + ("" if self.half is None else f" ± {self.half:.{decimals}f}") + f" (n={self.n}{extra})"


def estimate(values) -> Estimate | None:
    """Mean and 95 % CI of the values (None if there are none)."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    std = statistics.stdev(vals) if len(vals) > 1 else None
    return Estimate(statistics.fmean(vals), ci_half_width(std, len(vals)), len(vals), std)


def paired(a: dict, b: dict) -> Estimate | None:
    """The mean difference a[s] − b[s] over the keys (seeds) both have, with its 95 % CI."""
    return estimate(a[s] - b[s] for s in sorted(a.keys() & b.keys()))


def _interval(delta: Estimate, direction: int) -> tuple[float, float]:
    """The 95 % CI as (low, high) on the claimed side's scale: positive means "as claimed"."""
    assert delta.half is not None
    lo, hi = delta.mean - delta.half, delta.mean + delta.half
    return (lo, hi) if direction > 0 else (-hi, -lo)


def ci_text(delta: Estimate) -> str:
    """The 95 % CI of a Δ as the tables write it: "95 % CI [lo, hi]"."""
    assert delta.half is not None
    return f"95 % CI [{delta.mean - delta.half:+.1f}, {delta.mean + delta.half:+.1f}]"


def judge(delta: Estimate | None, direction: int = 1) -> tuple[str, str]:
    """(verdict, why) for a claim that ``delta`` is positive (direction 1) or negative (-1); the
    direction alone decides: holds when the 95 % CI excludes 0 on the claimed side, contradicted
    when it excludes 0 on the other side, inconclusive when it includes 0 (n < 2 included).
    Monotone: moving the interval towards the claimed side never gives a worse verdict."""
    if delta is None:
        return INCONCLUSIVE, "no pair of runs to compare"
    if delta.half is None:
        return INCONCLUSIVE, f"n = {delta.n}: no interval"
    lo, hi = _interval(delta, direction)
    if lo > 0:
        return HOLDS, f"{ci_text(delta)} excludes 0 on the claimed side"
    if hi < 0:
        return CONTRADICTED, f"{ci_text(delta)} excludes 0 on the other side"
    return INCONCLUSIVE, f"{ci_text(delta)} includes 0"


def judge_size(delta: Estimate | None, direction: int, magnitude: float) -> str | None:
    """A claimed size (``magnitude`` > 0 on the claimed side) against the 95 % CI: consistent when
    the CI contains it, smaller / larger when the CI lies entirely below / above it; None
    without an interval. Shown beside the verdict: a clear effect smaller than claimed still holds."""
    if delta is None or delta.half is None:
        return None
    lo, hi = _interval(delta, direction)
    if hi < magnitude:
        return SIZE_SMALLER
    return SIZE_LARGER if lo > magnitude else SIZE_CONSISTENT


def seeds_to_decide(delta: Estimate | None, bound: float = 0.0, level: float = LEVEL) -> int | None:
    """The fewest seeds whose CI at ``level`` (95 %; an equivalence's 90 %), at the observed
    spread, would exclude ``bound`` (0: a direction; a margin: an equivalence) for a Δ of the
    observed size: the smallest n with t((1 + level) / 2, n − 1) · std / √n < |mean − bound|.
    None when it cannot be said (no spread measured, a Δ at the bound, or more than MAX_SEEDS)."""
    if delta is None or delta.std is None or delta.mean == bound:
        return None
    distance = abs(delta.mean - bound)
    if delta.std == 0:
        return 2
    # t > 1.96 for every dof: no n below (1.96 std / distance)^2 can do; start there, walk up
    n = max(2, int((1.959 * delta.std / distance) ** 2))
    while n <= MAX_SEEDS:
        if t_quantile(0.5 + level / 2, n - 1) * delta.std / math.sqrt(n) < distance:
            return n
        n += 1
    return None


def combine(verdicts: list[str]) -> str:
    """One verdict from several comparisons of one claim: contradicted if any is, holds if all do."""
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else INCONCLUSIVE


EQUIVALENCE_LEVEL = 0.90  # two one-sided tests at 5 % each
EQUIVALENCE_MARGIN = 5.0  # points: "matches" when the paired Δ's 90 % CI lies inside ±5


def equivalence_interval(d: Estimate) -> tuple[float, float] | None:
    """The paired Δ's 90 % CI (low, high), or None for one seed."""
    if d.half is None or d.std is None:
        return None
    half = t_quantile(0.5 + EQUIVALENCE_LEVEL / 2, d.n - 1) * d.std / d.n**0.5
    return d.mean - half, d.mean + half


def equivalent(d: Estimate, margin: float) -> tuple[str, str]:
    """(verdict, why) of "a matches b" from their paired Δ: holds when its 90 % CI lies inside
    ±margin (two one-sided tests at 5 %), contradicted when its 95 % CI lies outside it."""
    interval = equivalence_interval(d)
    if interval is None or d.half is None:
        return INCONCLUSIVE, "one seed: no interval"
    low, high = interval
    ci = f"90 % CI [{low:+.1f}, {high:+.1f}]"
    if -margin < low and high < margin:
        return HOLDS, f"{ci} inside ±{margin:g}"
    if d.mean - d.half > margin or d.mean + d.half < -margin:
        return CONTRADICTED, f"95 % CI outside ±{margin:g}"
    return INCONCLUSIVE, f"{ci} reaches past ±{margin:g}"


def seeds_to_match(d: Estimate, margin: float) -> int | None:
    """The fewest seeds that would decide "a matches b" for a Δ of the observed size and spread:
    inside ±margin, those that bring its 90 % CI inside (holds); outside, those that take its
    95 % CI outside (contradicted). None as seeds_to_decide."""
    nearer = math.copysign(margin, d.mean)
    inside = abs(d.mean) < margin
    return seeds_to_decide(d, nearer, EQUIVALENCE_LEVEL if inside else LEVEL)


def p_value(d: Estimate | None, bound: float = 0.0) -> float | None:
    """The paired t test's two-sided p of "the mean Δ is ``bound``" (None below 2 seeds): the
    level at which the CI would just exclude the bound."""
    if d is None or d.std is None or d.n < 2:
        return None
    if d.std == 0:
        return 0.0 if d.mean != bound else 1.0
    t = abs(d.mean - bound) / (d.std / math.sqrt(d.n))
    return 1.0 - _t_central(t, d.n - 1)


def equivalence_p(d: Estimate | None, margin: float) -> float | None:
    """Two one-sided tests' p of "|Δ| < margin": the larger one-sided p (each at 5 %), i.e. the
    one-sided p against the nearer margin."""
    two_sided = p_value(d, math.copysign(margin, d.mean)) if d is not None else None
    if two_sided is None or d is None:
        return None
    inside = abs(d.mean) < margin
    return two_sided / 2 if inside else 1 - two_sided / 2


def holm(p_values: list[float], alpha: float = 1 - LEVEL) -> list[bool]:
    """Holm's step-down correction: which of the tests reject at family-wise level ``alpha``
    (the k-th smallest p against alpha / (m - k + 1), stopping at the first that does not)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected
