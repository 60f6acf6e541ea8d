"""pipeline.report.conclusions: two folders' tables, as the table writers write them, read back
for what they decide. Each expected state follows from the definition (a Δ is decided when its
95 % CI, mean ± half, excludes 0) applied by hand to the numbers below."""

from __future__ import annotations

import sys

from conftest import run

from pipeline.report import conclusions
from pipeline.report.stats import Estimate
from pipeline.report.studies import Delta, Row, Table, Value, direction_sentence
from pipeline.report.writers import write_table

CLAIMS_KEYS = ["claim", "source", "needs", "measured", "verdict", "size", "smallest detectable Δ", "seeds to decide"]


def write_folder(folder, deltas: dict[str, Estimate], gap: Estimate, verdicts: dict[str, str], seeds: int):
    """A results folder's tables: one row per entry of ``deltas`` with its Δ top-1 against random
    init, a direction sentence of ``gap`` under the table, and a claims table of ``verdicts``."""
    tables = folder / "tables"
    rows = [
        Row([name, "ResNet-18"], [Value(50.0, 2.0, d.n)], deltas=[Delta(d, d.n, 0)], reference=[False])
        for name, d in deltas.items()
    ]
    rows.append(Row(["random init", "ResNet-18"], [Value(30.0, 2.0, 5)], deltas=[None], reference=[True]))
    sentence = direction_sentence("MoCo (base cell)", "supervised", Delta(gap, gap.n, 0), "linear top-1")
    methods = Table("methods", "Methods", ["method", "backbone"], ["top1"], ["linear top-1"], rows, notes=[sentence])
    methods.compared = [("top1", "random init")]
    write_table(methods, tables)
    claim_rows = [
        Row([f"{claim} (run: 9 epochs, {seeds} seeds)", "seed 000", "", "", verdict, "", "", ""], [])
        for claim, verdict in verdicts.items()
    ]
    write_table(Table("claims", "Claims", CLAIMS_KEYS, [], [], claim_rows), tables)
    return folder


def test_what_each_pair_of_tables_decides(tmp_path):
    a = write_folder(
        tmp_path / "a",
        {
            "decided up": Estimate(3.0, 1.0, 5),  # CI [2, 4]
            "order of equal means": Estimate(0.3, 3.4, 10),  # CI [-3.1, 3.7]: no direction
            "decided in A only": Estimate(3.0, 1.0, 5),
            "one seed": Estimate(4.0, None, 1),  # no interval: undecided
        },
        gap=Estimate(-31.6, 3.3, 10),
        verdicts={"Claim X": "holds", "Claim Y": "holds", "Claim Z": "inconclusive"},
        seeds=5,
    )
    b = write_folder(
        tmp_path / "b",
        {
            "decided up": Estimate(-3.0, 1.0, 5),  # CI [-4, -2]: the other way
            "order of equal means": Estimate(-0.7, 3.3, 10),  # the means' order flipped, still no direction
            "decided in A only": Estimate(3.0, 4.0, 5),  # CI [-1, 7]
            "one seed": Estimate(-4.0, None, 1),
        },
        gap=Estimate(-31.6, 3.7, 10),
        verdicts={"Claim X": "holds", "Claim Y": "contradicted", "Claim Z": "holds"},
        seeds=19,  # the claims' run text differs; the claim is the same
    )
    rows = conclusions.compare(conclusions.conclusions(a), conclusions.conclusions(b))
    states = {r["conclusion"]: r["state"] for r in rows}
    assert states == {
        "methods: decided up ResNet-18, Δ top1": conclusions.REVERSED,
        "methods: order of equal means ResNet-18, Δ top1": conclusions.NEITHER,
        "methods: decided in A only ResNet-18, Δ top1": conclusions.ONE_ONLY,
        "methods: one seed ResNet-18, Δ top1": conclusions.NEITHER,
        "MoCo (base cell) − supervised, linear top-1, paired by seed": conclusions.ALIKE,
        "claim: Claim X": conclusions.ALIKE,
        "claim: Claim Y": conclusions.REVERSED,
        "claim: Claim Z": conclusions.ONE_ONLY,
    }
    shown = {r["conclusion"]: (r["A"], r["B"]) for r in rows}
    assert shown["methods: decided up ResNet-18, Δ top1"] == ("+3.0 ± 1.0 (n=5)", "-3.0 ± 1.0 (n=5)")


def test_the_command_fails_only_on_a_reversed_conclusion(tmp_path, capsys):
    same = {"Claim X": "holds"}
    a = write_folder(tmp_path / "a", {"MoCo": Estimate(0.3, 3.4, 10)}, Estimate(-31.6, 3.3, 10), same, 5)
    b = write_folder(tmp_path / "b", {"MoCo": Estimate(-0.7, 3.3, 10)}, Estimate(-31.6, 3.7, 10), same, 5)
    assert conclusions.main([str(a), str(b)]) == 0  # only an undecided Δ's sign moved
    out = capsys.readouterr().out
    assert "alike: 2, REVERSED: 0, decided in one only: 0, decided in neither: 1." in out
    assert "methods: MoCo ResNet-18" not in out  # an undecided Δ is counted, not listed
    more = {"MoCo": Estimate(0.3, 3.4, 10), "SimCLR": Estimate(2.0, 1.0, 5)}  # a row A has not
    c = write_folder(tmp_path / "c", more, Estimate(+31.6, 3.7, 10), same, 5)
    proc = run([sys.executable, "-m", "pipeline.report.conclusions", a, c], check=False)  # as a user runs it
    assert proc.returncode == 1, proc.stderr
    assert (
        "| MoCo (base cell) − supervised, linear top-1, paired by seed | Δ -31.6 ± 3.3 (n=10) | Δ +31.6" in proc.stdout
    )
    assert "Stated in A only: 0; in B only: 1" in proc.stdout
