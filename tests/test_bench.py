"""The speed benchmarks run end to end on real data (tiny sizes; they measure, they do not assert speed).

Their arithmetic (ratios, floors) is checked against times the test sets: the real measurement
still runs, then its medians are replaced by round numbers whose ratios are worked out by hand.
"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

TINY = "workflow/config/presets/tiny.yaml"


def set_medians(module, medians: dict, measured: dict):
    """``module.interleaved`` runs as before (its real medians go into ``measured``), then
    reports ``medians`` (seconds per candidate) instead."""
    real = module.interleaved

    def interleaved(candidates, rounds, warmup=1):
        res = real(candidates, rounds, warmup)
        measured.update(res)
        return {name: {**r, "median_s": medians[name]} for name, r in res.items()}

    return interleaved


def test_bench_epoch_takes_an_epoch_apart(ffcv_small, tmp_path, monkeypatch, repo):
    from pipeline.bench import epoch

    monkeypatch.chdir(tmp_path)  # bench/out/ of this run lands here
    measured: dict = {}
    medians = {"model": 2.0, "loader": 1.0, "recipe": 0.5, "real": 2.5}
    monkeypatch.setattr(epoch, "interleaved", set_medians(epoch, medians, measured))
    result = epoch.main(["--configfile", str(repo / TINY), "--data", str(ffcv_small), "--rounds", "1"])
    assert set(measured) == {"model", "loader", "recipe", "real"}
    assert all(r["median_s"] > 0 for r in measured.values())
    # each epoch time over the model's 2.0 s
    assert result["ratio_vs_model"] == {"model": 1.0, "loader": 0.5, "recipe": 0.25, "real": 1.25}
    assert result["width"] == 8 and result["threads"] == 1  # the preset, layered over the default config
    saved = json.loads((tmp_path / "bench" / "out" / "epoch.json").read_text())
    assert saved["machine"]["cpu"]["model"]


@pytest.mark.integration
def test_bench_cores_compares_thread_layouts(ffcv_small, tmp_path, monkeypatch, repo):
    from pipeline.bench import cores

    monkeypatch.chdir(repo)  # workers run `python -m pipeline.bench` from the repository
    monkeypatch.setattr(cores, "write", lambda name, result: tmp_path / f"{name}.json")
    real, measured = cores.run_layout, []
    rates = {(1, 2): [4.0, 8.0], (2, 1): [5.0, 6.0]}  # steps/s per round, set by the test

    def run_layout(configfiles, data, jobs, threads, epochs):
        if len(measured) < len(rates):  # the workers run in the first round only (time)
            measured.append(real(configfiles, data, jobs, threads, epochs))
        return rates[jobs, threads].pop(0)

    monkeypatch.setattr(cores, "run_layout", run_layout)
    result = cores.main(
        ["--configfile", str(repo / TINY), "--data", str(ffcv_small), "--cores", "2", "--epochs", "1", "--rounds", "2"]
    )
    assert len(measured) == 2 and all(r > 0 for r in measured)  # the workers of both layouts ran
    layouts = result["layouts"]
    assert {(r["jobs"], r["threads"]) for r in layouts.values()} == {(1, 2), (2, 1)}
    # medians: one job 6.0 steps/s (4 and 8), two jobs 5.5 (5 and 6): 5.5 / 6
    assert layouts["1 job(s) x 2 thread(s)"]["steps_per_s"] == 6.0
    assert layouts["2 job(s) x 1 thread(s)"]["steps_per_s"] == 5.5
    assert layouts["2 job(s) x 1 thread(s)"]["ratio_vs_one_job"] == 0.917


def test_bench_step_measures_the_floor_beside_the_steps(tmp_path, monkeypatch):
    from pipeline.bench import step

    monkeypatch.chdir(tmp_path)
    measured: dict = {}
    medians = {"supervised": 2.0, "key_forward": 0.5, "moco_v2": 3.0, "moco_v3": 6.0, "moco_v2_unguarded": 2.5}
    medians |= {"end_to_end": 4.0, "simclr": 4.4, "byol": 6.3, "moco_v3_vit": 9.0}
    monkeypatch.setattr(step, "interleaved", set_medians(step, medians, measured))
    result = step.main(["--batch", "16", "--size", "16", "--width", "4", "--rounds", "1"])
    assert set(measured) == set(medians) and all(r["median_s"] > 0 for r in measured.values())
    # the floor: the supervised step plus the key forward, 2.0 + 0.5, over the supervised 2.0
    assert result["moco_v2_measured_floor"] == 1.25
    assert result["ratio_vs_supervised"] == {"moco_v2": 1.5, "moco_v3": 3.0, "moco_v2_unguarded": 1.25}
    assert result["moco_v2_over_measured_floor"] == 1.2  # 1.5 / 1.25
    assert result["floor"] == {"moco_v2": 1.333, "moco_v3": 2.667}  # (3 + 1) / 3 and (2 * 3 + 2) / 3
    assert result["samples_per_s"]["supervised"] == 8.0  # 16 images in 2.0 s
    # each rival over its nearest MoCo step: SimCLR 4.4 / end-to-end 4.0, BYOL 6.3 / v3 6.0
    assert result["rival_ratios"] == {"simclr/end_to_end": 1.1, "byol/moco_v3": 1.05}
    # the demo grid's ViT beside the base cell's step (9.0 / 3.0) and v3's ResNet step (9.0 / 6.0)
    assert result["vit_ratios"] == {"moco_v3_vit/moco_v2": 3.0, "moco_v3_vit/moco_v3": 1.5}


def test_bench_step_on_the_fast_path(tmp_path, monkeypatch):
    """--fast-path on: every step in bf16 autocast, channels_last where the model takes it, and
    the split-BN model also timed contiguous (what its blocks in channels_last save)."""
    from pipeline.bench import step

    monkeypatch.chdir(tmp_path)
    result = step.main(["--batch", "16", "--size", "16", "--width", "4", "--rounds", "1", "--fast-path", "on"])
    assert "moco_v2_contiguous" in result["results"] and result["split_bn_channels_last_over_contiguous"] > 0
    assert result["fast_path"].startswith("on") and (tmp_path / "bench" / "out" / "step_fast_path.json").is_file()


def test_bench_step_times_both_paths_in_one_run(tmp_path, monkeypatch):
    """--fast-path both: every step on either path, interleaved together; each step's speed-up is
    its fp32 median over its fast path's, and each path keeps its own ratios and floor."""
    from pipeline.bench import step

    monkeypatch.chdir(tmp_path)
    measured: dict = {}
    fp32 = {"supervised": 2.0, "key_forward": 0.5, "moco_v2": 3.0, "moco_v3": 6.0, "moco_v2_unguarded": 2.5}
    fp32 |= {"end_to_end": 4.0, "simclr": 4.4, "byol": 6.3, "moco_v3_vit": 9.0}
    fast = {name: seconds / 2 for name, seconds in fp32.items()} | {"moco_v2": 2.0, "moco_v2_contiguous": 2.5}
    medians = {f"{n}@fp32": s for n, s in fp32.items()} | {f"{n}@fast": s for n, s in fast.items()}
    monkeypatch.setattr(step, "interleaved", set_medians(step, medians, measured))
    result = step.main(["--batch", "16", "--size", "16", "--width", "4", "--rounds", "1", "--fast-path", "both"])
    assert set(measured) == set(medians)  # one interleaved run of both paths
    assert result["fast_path_speedup"]["supervised"] == 2.0  # 2.0 s / 1.0 s
    assert result["fast_path_speedup"]["moco_v2"] == 1.5  # 3.0 s / 2.0 s
    off, on = result["paths"]["off"], result["paths"]["on"]
    assert off["moco_v2_over_measured_floor"] == 1.2  # 1.5 / (2.0 + 0.5) * 2.0, as on one path
    # on the fast path: 2.0 / 1.0 over the floor (1.0 + 0.25) / 1.0: 2.0 / 1.25
    assert on["moco_v2_over_measured_floor"] == 1.6 and on["split_bn_channels_last_over_contiguous"] == 0.8
    assert off["fast_path"].startswith("off") and on["fast_path"].startswith("on")
    assert (tmp_path / "bench" / "out" / "step_paths.json").is_file()


@pytest.mark.integration
def test_bench_detection_times_a_step_on_both_paths(tmp_path, monkeypatch, repo):
    """The workflow's detector at the preset's detect settings, one batch of the embedded scenes:
    a step in fp32 and one on the fast path in one interleaved run, and the fp32 evaluation; the
    speed-up is the fp32 step's median over the fast path's."""
    from pipeline.bench import detection

    monkeypatch.chdir(repo)  # config.yaml and the preset, as the command runs
    monkeypatch.setattr(detection, "write", lambda name, result: tmp_path / f"{name}.json")
    measured: dict = {}
    medians = {"step fp32": 3.0, "step fast": 2.0, "evaluation forward (fp32)": 1.0}
    monkeypatch.setattr(detection, "interleaved", set_medians(detection, medians, measured))
    result = detection.main(["--configfile", TINY, "--rounds", "1"])
    assert set(measured) == set(medians) and all(r["median_s"] > 0 for r in measured.values())
    assert result["step_fp32_over_fast_path"] == 1.5 and result["task"] == "segmentation"
    assert result["image_size"] == 64 and result["batch_size"] == 4  # the tiny preset's over config.yaml's


def test_bench_gpu_dry_runs_the_fast_path_on_cpu(tmp_path, monkeypatch):
    """bench gpu's lines (the Trainer's fast path, FLOP count, MFU) on CPU, tiny sizes."""
    from pipeline.bench import gpu

    monkeypatch.chdir(tmp_path)
    result = gpu.main(["--dry", "--fast-path", "on"])
    assert set(result["results"]) == {"moco_v2_resnet50", "moco_v3_vit_small"} and result["fast_path"] == "on"
    assert all(r["s_per_step"] > 0 and r["img_per_s"] > 0 for r in result["results"].values())


@pytest.mark.integration
def test_bench_startup_times_each_import_in_a_fresh_process_beside_torch(tmp_path, monkeypatch):
    """Real imports (one round, fresh interpreters): a light module imports none of the heavy
    packages, torch's own ratio is 1, the result is written, and of the two first steps only
    torch.optim.SGD's imports torch._dynamo."""
    from pipeline.bench import startup

    monkeypatch.chdir(tmp_path)
    result = startup.main(["--rounds", "1", "--modules", "pipeline.base.layout", "--first-step"])
    rows = result["imports"]
    assert rows["torch"]["ratio_to_torch"] == 1.0 and rows["torch"]["median_s"] > 0
    assert rows["pipeline.base.layout"]["imports"] == [] and (tmp_path / "bench/out/startup.json").is_file()
    # a first step of the stages' SGD leaves torch._dynamo out; torch's own SGD imports it
    assert rows["pipeline.base.layout+sgd"]["imports"] == []
    assert rows["pipeline.base.layout+torch-sgd"]["imports"] == ["torch._dynamo"]


def test_bench_startup_reports_the_ratio_of_medians_to_import_torch(monkeypatch):
    """On set times: medians 3.0 s over torch's 2.0 s is 1.5; the warm-up round is not counted."""
    from pipeline.bench import startup

    seconds = {"torch": [2.0, 2.2, 1.0], "stage": [3.0, 9.0, 2.9]}  # medians 2.0 and 3.0
    calls: dict[str, int] = {}

    def fake(module):
        calls[module] = calls.get(module, -1) + 1  # the first call is the warm-up
        return {"s": seconds[module][max(calls[module] - 1, 0)], "heavy": ["timm"] if module == "stage" else []}

    monkeypatch.setattr(startup, "import_once", fake)
    rows = startup.measure(["stage"], rounds=3)
    assert rows["stage"]["ratio_to_torch"] == 1.5 and rows["stage"]["imports"] == ["timm"]


@pytest.mark.integration
def test_suite_vs_times_two_commits_each_importing_its_own_pipeline(tmp_path):
    """bench/suite_vs.sh (issue 50's measure): each side a fresh clone run as make test runs it,
    importing its own pipeline/, both times and their ratio in the summary, with the CPU. VENV
    is given relative to the checkout, as a user types it: each side still finds it from its clone."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "VENV": os.path.relpath(sys.prefix, REPO)}
    proc = subprocess.run(
        ["bash", "bench/suite_vs.sh", "HEAD", "tests/test_stats.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("CPU: ") and summary[1] == "pytest arguments: tests/test_stats.py"
    assert len(summary) == 5 and summary[-1].startswith("HEAD / HEAD: ")
    for side in summary[2:4]:
        assert re.fullmatch(r"[0-9a-f]+: \d+ s, exit 0: =+ \d+ passed in .*", side), side
    assert len(list(out.glob("*.log"))) == 2


def test_the_timeline_plugin_writes_each_tests_start_and_end_with_cpu(tmp_path, repo):
    """bench/pytest_timeline.py: a test that spins the CPU for a while shows a later end than
    start and CPU seconds spent between them."""
    spin = "import time\ndef test_spin():\n    t = time.process_time()\n"
    (tmp_path / "test_spin.py").write_text(spin + "    while time.process_time() - t < 0.2:\n        pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}  # this run is no worker
    env |= {"PYTHONPATH": str(repo / "bench"), "TIMELINE_DIR": str(tmp_path / "tl")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_timeline", "-p", "no:cacheprovider", "test_spin.py"]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    start, end = [json.loads(line) for line in (tmp_path / "tl" / "main.jsonl").read_text().splitlines()]
    assert (start["ev"], end["ev"]) == ("start", "end") and start["id"] == end["id"] == "test_spin.py::test_spin"
    assert end["t"] > start["t"] and end["cpu"] - start["cpu"] >= 0.18  # os.times counts 10 ms ticks
