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
    Estimate,
    combine,
    estimate,
    judge,
    paired,
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
    assert e.text() == "2.0 ± 2.5 (n=3)"
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
    # a claimed size: CI [1.76, 4.24] reaches 4 but lies entirely short of 5
    assert judge(up, magnitude=4)[0] == HOLDS
    verdict, why = judge(up, magnitude=5)
    assert verdict == CONTRADICTED and "claimed size" in why
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([HOLDS, CONTRADICTED, INCONCLUSIVE]) == CONTRADICTED and combine([]) == INCONCLUSIVE


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
    assert provenance.environment_note([]) is None
