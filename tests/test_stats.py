"""The tables' statistics: 95 % CIs (Student t) computed by hand with the t quantiles of a
printed table, paired differences by seed, one case of each verdict; and the provenance record."""

import hashlib
import math

import pytest
from conftest import REPO

from pipeline.report.stats import (
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    SIZE_CONSISTENT,
    SIZE_LARGER,
    SIZE_SMALLER,
    Estimate,
    combine,
    estimate,
    judge,
    judge_size,
    paired,
    seeds_to_decide,
    t_quantile,
)
from pipeline.runtime import provenance

# t(0.975, dof) from a printed table of Student's t (two-sided 95 %)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 19: 2.093, 30: 2.042}


@pytest.mark.parametrize("dof, t", T_TABLE.items())
def test_t_quantile_matches_the_printed_table(dof, t):
    assert t_quantile(0.975, dof) == pytest.approx(t, abs=5e-4)


def test_t_quantile_other_levels_and_bad_input():
    assert t_quantile(0.95, 4) == pytest.approx(2.132, abs=5e-4)  # one-sided 95 %, 4 dof
    assert t_quantile(0.995, 2) == pytest.approx(9.925, abs=5e-4)
    for p, dof in ((0.4, 3), (1.0, 3), (0.975, 0), (0.975, 2.5)):
        with pytest.raises(ValueError):
            t_quantile(p, dof)


def test_mean_and_ci_by_hand():
    # 1, 2, 3: mean 2, sample std 1, half-width t(0.975, 2) * 1 / sqrt(3) = 4.303 / 1.732 = 2.484
    e = estimate([1, 2, 3])
    assert (e.mean, e.n) == (2.0, 3) and e.half == pytest.approx(4.303 / math.sqrt(3), rel=1e-3)
    assert e.text() == "2.0 ± 2.5 (n=3)" and e.std == 1.0
    one = estimate([7.25])
    assert one == Estimate(7.25, None, 1) and one.text() == "7.2 (n=1)" and one.half is None
    assert estimate([]) is None


def test_paired_difference_by_seed():
    base = {0: 60.0, 1: 62.0, 2: 58.0, 3: 61.0, 4: 59.0}
    cell = {0: 63.0, 1: 66.0, 2: 60.0, 3: 65.0, 4: 61.0, 7: 99.0}  # seed 7: no base run, no pair
    # differences 3, 4, 2, 4, 2: mean 3, deviations 0, 1, -1, 1, -1 -> variance 4/4 = 1, std 1;
    # half-width t(0.975, 4) * 1 / sqrt(5) = 2.776 / 2.236 = 1.241
    d = paired(cell, base)
    assert (d.mean, d.n) == (3.0, 5) and d.half == pytest.approx(2.776 / math.sqrt(5), rel=1e-3)
    assert d.text(signed=True) == "+3.0 ± 1.2 (n=5)"
    # unpaired, the seed-to-seed spread of the base (std 1.58) would swamp the same difference
    assert paired({0: 1.0}, {1: 1.0}) is None


def test_one_case_of_each_verdict():
    up = paired({0: 63, 1: 66, 2: 60, 3: 65, 4: 61}, {0: 60, 1: 62, 2: 58, 3: 61, 4: 59})  # +3.0 ± 1.24
    assert judge(up)[0] == HOLDS
    assert judge(up, direction=-1)[0] == CONTRADICTED  # the claim said "worse"
    # -3 ± 4.303/sqrt(3) = -3 ± 2.48: CI [-5.48, -0.52], excludes 0 below
    assert judge(estimate([-3, -4, -2]))[0] == CONTRADICTED
    # 1, -1, 3: mean 1, std 2, half 4.303 * 2 / sqrt(3) = 4.97: the CI includes 0
    verdict, why = judge(estimate([1, -1, 3]))
    assert verdict == INCONCLUSIVE and "includes 0" in why
    assert judge(estimate([5.0]))[0] == INCONCLUSIVE  # n = 1: never a verdict
    assert judge(None)[0] == INCONCLUSIVE
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HOLDS, CONTRADICTED, INCONCLUSIVE]) == CONTRADICTED and combine([]) == INCONCLUSIVE


# "m < 0.99 loses ~5 points": direction -1, size 5. The issue's four intervals, each written as
# mean ± half: the direction decides the verdict, the size is judged beside it.
@pytest.mark.parametrize(
    "mean, half, ci, verdict, size",
    [
        (-1.0, 1.5, "[-2.5, +0.5]", INCONCLUSIVE, SIZE_SMALLER),  # straddles 0; at most 2.5 below
        (-1.0, 0.5, "[-1.5, -0.5]", HOLDS, SIZE_SMALLER),  # a clear loss, smaller than 5
        (-2.5, 2.4, "[-4.9, -0.1]", HOLDS, SIZE_SMALLER),  # a clear loss, just short of 5
        (-20.0, 1.0, "[-21.0, -19.0]", HOLDS, SIZE_LARGER),  # a loss far beyond 5
    ],
)
def test_the_issues_four_intervals_for_a_claimed_loss(mean, half, ci, verdict, size):
    delta = Estimate(mean, half, 3)
    got, why = judge(delta, direction=-1)
    assert got == verdict and why.startswith(f"95 % CI {ci}")
    assert judge_size(delta, direction=-1, magnitude=5) == size


def test_verdict_boundaries_by_hand():
    # 3, 4, 5: mean 4, std 1, half t(0.975, 2) / sqrt 3 = 4.303 / 1.732 = 2.484: CI [1.516, 6.484]
    up = estimate([3, 4, 5])
    assert judge(up) == (HOLDS, "95 % CI [+1.5, +6.5] excludes 0 on the claimed side")
    assert judge(up, direction=-1) == (CONTRADICTED, "95 % CI [+1.5, +6.5] excludes 0 on the other side")
    # 1, 2, 3: mean 2, std 1, the same half: CI [-0.484, 4.484] includes 0 whichever the claim
    straddle = estimate([1, 2, 3])
    assert judge(straddle)[0] == judge(straddle, direction=-1)[0] == INCONCLUSIVE
    # an end exactly at 0 still includes it; just inside it, the CI excludes 0
    assert judge(Estimate(2.0, 2.0, 3))[0] == INCONCLUSIVE
    assert judge(Estimate(2.0, 1.999, 3))[0] == HOLDS
    assert judge(Estimate(-2.0, 2.0, 3), direction=-1)[0] == INCONCLUSIVE
    assert judge(Estimate(-2.0, 1.999, 3), direction=-1)[0] == HOLDS


def test_size_boundaries_by_hand():
    up = estimate([3, 4, 5])  # CI [1.516, 6.484] (above)
    assert judge_size(up, 1, 5) == SIZE_CONSISTENT
    assert judge_size(up, 1, 1.515) == SIZE_LARGER  # the whole CI above 1.515
    assert judge_size(up, 1, 1.517) == SIZE_CONSISTENT
    assert judge_size(up, 1, 6.483) == SIZE_CONSISTENT
    assert judge_size(up, 1, 6.485) == SIZE_SMALLER  # the whole CI below 6.485
    # a claimed loss of 5 against a gain: the CI on the claimed side is [-6.484, -1.516]
    assert judge_size(up, -1, 5) == SIZE_SMALLER
    assert judge_size(Estimate(4.0, 1.0, 3), 1, 5) == SIZE_CONSISTENT  # CI [3, 5]: its end counts
    assert judge_size(Estimate(4.0, 1.0, 3), 1, 3) == SIZE_CONSISTENT
    assert judge_size(estimate([5.0]), 1, 5) is None and judge_size(None, 1, 5) is None


@pytest.mark.parametrize("direction", [1, -1])
def test_a_stronger_result_never_gets_a_worse_verdict(direction):
    rank = {CONTRADICTED: 0, INCONCLUSIVE: 1, HOLDS: 2}
    for half in (0.5, 2.0, 7.0):
        means = [direction * x / 4 for x in range(-60, 61)]  # -15 .. 15 towards the claimed side
        ranks = [rank[judge(Estimate(m, half, 3), direction)[0]] for m in means]
        assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 2


def test_seeds_to_decide_by_hand():
    # 1, 2, 3: mean 2, std 1; t(0.975, n - 1) / sqrt(n) < 2 first at n = 4:
    # n = 3: 4.303 / 1.732 = 2.48; n = 4: 3.182 / 2 = 1.59
    assert seeds_to_decide(estimate([1, 2, 3])) == 4
    # 1, -1, 3: mean 1, std 2: 2 t / sqrt(n) < 1 first at n = 18:
    # n = 17: 2 x 2.120 / 4.123 = 1.028; n = 18: 2 x 2.110 / 4.243 = 0.995
    assert seeds_to_decide(estimate([1, -1, 3])) == 18
    # 3, 4, 5 already decide it: the n it needs is at most its own
    assert seeds_to_decide(estimate([3, 4, 5])) == 3
    assert seeds_to_decide(estimate([2, 2, 2])) == 2  # no spread: any interval excludes 0
    assert seeds_to_decide(estimate([1, -1])) is None  # no Δ observed: nothing decides it
    assert seeds_to_decide(estimate([4.0])) is None  # one seed: no spread measured


def test_seeds_to_decide_an_equivalence_margin_by_hand():
    # 1, 5, 3 against a bound of 5: mean 3, std 2, distance 2: t(0.975, n - 1) / sqrt(n) < 1 first
    # at n = 7: n = 6: 2.571 / 2.449 = 1.05; n = 7: 2.447 / 2.646 = 0.925
    assert seeds_to_decide(estimate([1, 5, 3]), 5.0) == 7
    # the same against 0: distance 3: n = 4: 3.182 x 2 / 2 = 3.18; n = 5: 2.776 x 2 / 2.236 = 2.48 < 3
    assert seeds_to_decide(estimate([1, 5, 3])) == 5
    assert seeds_to_decide(estimate([4, 6, 5]), 5.0) is None  # a Δ at the bound: nothing decides it


def test_seeds_to_match_by_hand():
    """t(0.95, dof) from a printed table: 2: 2.920, 3: 2.353; t(0.975, dof): 3: 3.182, 4: 2.776."""
    from pipeline.report.stats import seeds_to_match

    # -4, 0, -2: mean -2, std 2, 3 from the margin -5; the 90 % CI inside first at n = 4:
    # n = 3: 2.920 x 2 / 1.732 = 3.37; n = 4: 2.353 x 2 / 2 = 2.35 < 3 (at 95 % n = 4 gives 3.18: 5)
    assert seeds_to_match(estimate([-4, 0, -2]), 5.0) == 4
    # -8, -6, -10: mean -8, 3 beyond -5: the 95 % CI outside first at n = 5: 2.776 x 2 / 2.236 = 2.48
    assert seeds_to_match(estimate([-8, -6, -10]), 5.0) == 5
    assert seeds_to_match(estimate([5, 6, 4]), 5.0) is None  # a Δ at the margin: nothing decides it


# --- provenance ---------------------------------------------------------------------------------
def test_cpu_model_and_flags_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n"
    )
    assert provenance.cpu(info) == {"model": "AMD EPYC 7B13", "flags": ["avx2"]}
    assert provenance.cpu(tmp_path / "absent")["flags"] == []  # never fails


def test_commit_outside_a_checkout_is_none(tmp_path):
    assert provenance.git_commit(tmp_path) is None
    assert provenance.git_commit(tmp_path / "absent") is None


def test_record_and_footnote():
    assert provenance.record(fast_path="fp32")["fast_path"] == "fp32"
    rec = provenance.record()
    assert set(rec) == {"cpu", "versions", "commit", "environment"} and set(rec["versions"]) == set(
        provenance.LIBRARIES
    )
    lock_sha256 = hashlib.sha256((REPO / "requirements.lock").read_bytes()).hexdigest()
    assert rec["environment"] == {"lock_sha256": lock_sha256, "not_as_locked": {}}  # the venv is the lock's
    assert provenance.locked_environment(REPO / "absent.lock") == {"lock_sha256": None, "not_as_locked": None}
    amd = {
        "cpu": {"model": "AMD EPYC 7B13", "flags": ["avx2"]},
        "versions": {"torch": "2.4.0", "torchvision": "0.19.0", "numpy": "1.26.4", "ffcv": "1.0.2"},
        "commit": "0123456789abcdef0123",
    }
    intel = {**amd, "cpu": {"model": "Intel Xeon", "flags": ["avx2", "avx512f"]}}
    assert provenance.environment_note([amd, amd]) == (
        "Ran on: CPU: AMD EPYC 7B13 (avx2, no avx512f); versions: torch 2.4.0, torchvision 0.19.0, "
        "numpy 1.26.4, ffcv 1.0.2; commit: 0123456789ab."
    )
    note = provenance.environment_note([amd, intel, intel, None])
    differ = "CPU DIFFER across runs: Intel Xeon (avx2, avx512f) (2 runs); AMD EPYC 7B13 (avx2, no avx512f) (1 run)"
    assert differ in note
    assert note.endswith("1 of 4 runs did not record it.")
    assert provenance.environment_note([None]).startswith("Ran on: not recorded")
    # a pretraining names the path its steps took; a probe's record has none and does not count
    bf16, fp32 = {**amd, "fast_path": "bf16 autocast"}, {**amd, "fast_path": "fp32"}
    assert provenance.environment_note([fp32, amd]).endswith("commit: 0123456789ab; pretraining steps: fp32.")
    note = provenance.environment_note([bf16, fp32, fp32, amd])
    assert "pretraining steps DIFFER across runs: fp32 (2 runs); bf16 autocast (1 run)" in note
    assert provenance.environment_note([]) is None


def test_seeds_to_decide_gives_up_beyond_max_seeds():
    from pipeline.report.stats import MAX_SEEDS, Estimate, seeds_to_decide

    # mean 0.01, std 10: t * 10 / sqrt(n) < 0.01 needs sqrt(n) > 1000 t, n > 10^6 (t > 1.96)
    # -> more than MAX_SEEDS (10,000): nothing can be said
    assert MAX_SEEDS < 10**6
    assert seeds_to_decide(Estimate(mean=0.01, half=1.0, n=3, std=10.0)) is None
    assert seeds_to_decide(Estimate(mean=-0.01, half=1.0, n=3, std=10.0)) is None


def test_paired_t_p_value_by_the_closed_form_at_two_degrees_of_freedom():
    """dof 2: P(|T| <= t) = t / sqrt(2 + t²). Δs 1, 2, 3: t = 2 / (1 / sqrt 3) = 3.464."""
    from pipeline.report.stats import equivalence_p, p_value

    t = 2 * math.sqrt(3)
    assert p_value(estimate([1.0, 2.0, 3.0])) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert p_value(estimate([1.0])) is None and p_value(estimate([2.0, 2.0])) == 0.0
    # |Δ| < 5 at Δs 1, 0, 1: against +5, t = (5 - 2/3) / (0.577 / sqrt 3) = 13.0, one-sided half of it
    d = estimate([1.0, 0.0, 1.0])
    t = (5 - 2 / 3) / (math.sqrt(1 / 3) / math.sqrt(3))
    assert equivalence_p(d, 5.0) == pytest.approx((1 - t / math.sqrt(2 + t * t)) / 2, rel=1e-9)


def test_holm_steps_down_and_stops_at_the_first_test_it_keeps():
    """Sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stop, 0.04 is kept too."""
    from pipeline.report.stats import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.04]) == [True] and holm([]) == []
