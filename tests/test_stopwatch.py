"""pipeline.runtime.stopwatch: a job's seconds by phase, checked on a clock the test moves, and the
process's age where the platform has no boot clock."""


def test_process_age_is_zero_without_a_boot_clock(monkeypatch):
    from pipeline.runtime import stopwatch

    assert stopwatch.process_age() > 0  # Linux: this process started before this line
    monkeypatch.delattr(stopwatch.time, "CLOCK_BOOTTIME")  # as on macOS
    assert stopwatch.process_age() == 0.0


def test_stopwatch_report_by_hand(monkeypatch):
    """A clock the test moves: the process started 2 s before the Stopwatch; setup (marked),
    two spells of steps, a kNN pass, a second mark, then 1 s that no phase claimed."""
    from types import SimpleNamespace

    from pipeline.runtime import stopwatch

    now = [100.0]
    monkeypatch.setattr(stopwatch, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(stopwatch, "process_age", lambda: 2.0)
    watch = stopwatch.Stopwatch()  # the process started at 98
    now[0] = 101.0
    watch.mark("setup")  # 98 -> 101: 3 s
    for start, end, name in ((101.0, 105.0, "steps"), (106.0, 107.0, "steps"), (107.0, 108.5, "knn")):
        now[0] = start
        with watch.phase(name):
            now[0] = end
    now[0] = 109.0
    watch.mark("teardown")  # unclaimed so far: 105 -> 106 and 108.5 -> 109
    now[0] = 110.0
    # wall 110 - 98 = 12; other: 12 - (3 + 5 + 1.5 + 1.5)
    expected = {"setup": 3.0, "steps": 5.0, "knn": 1.5, "teardown": 1.5, "other": 1.0, "wall": 12.0}
    assert watch.report() == expected
