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
    return Estimate(statistics.fmean(vals), ci_half_width(std, len(vals)), len(vals))


def paired(a: dict, b: dict) -> Estimate | None:
    """The mean difference a[s] − b[s] over the keys (seeds) both have, with its 95 % CI."""
    return estimate(a[s] - b[s] for s in sorted(a.keys() & b.keys()))


def judge(delta: Estimate | None, direction: int = 1, magnitude: float | None = None) -> tuple[str, str]:
    """(verdict, why) for a claim that ``delta`` is positive (direction 1) or negative (-1), by at
    least ``magnitude`` if the claim states one: holds when the 95 % CI excludes 0 on the claimed
    side and reaches the magnitude; contradicted when it excludes 0 on the other side, or lies
    entirely short of the claimed magnitude; inconclusive otherwise (n < 2 included)."""
    if delta is None:
        return INCONCLUSIVE, "no pair of runs to compare"
    if delta.half is None:
        return INCONCLUSIVE, f"n = {delta.n}: no interval"
    low, high = delta.mean - delta.half, delta.mean + delta.half
    lo, hi = sorted((direction * low, direction * high))
    ci = f"95 % CI [{low:+.1f}, {high:+.1f}]"
    if hi < 0:
        return CONTRADICTED, f"{ci} excludes 0 on the other side"
    if lo <= 0:
        return INCONCLUSIVE, f"{ci} includes 0"
    if magnitude is not None and hi < magnitude:
        return CONTRADICTED, f"{ci} excludes the claimed size ({magnitude:g})"
    return HOLDS, f"{ci} excludes 0" + ("" if magnitude is None else f" and reaches {magnitude:g}")


def combine(verdicts: list[str]) -> str:
    """One verdict from several comparisons of one claim: contradicted if any is, holds if all do."""
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else INCONCLUSIVE
