"""The speed benchmarks run end to end on real data (tiny sizes; they measure, they do not assert speed)."""

import json

TINY = "workflow/config/presets/tiny.yaml"


def test_bench_epoch_takes_an_epoch_apart(ffcv_small, tmp_path, monkeypatch, repo):
    from pipeline.bench import epoch

    monkeypatch.chdir(tmp_path)  # bench/out/ of this run lands here
    result = epoch.main(["--configfile", str(repo / TINY), "--data", str(ffcv_small), "--rounds", "1"])
    assert set(result["results"]) == {"model", "loader", "recipe", "real"}
    assert all(r["median_s"] > 0 for r in result["results"].values())
    assert result["ratio_vs_model"]["model"] == 1.0 and result["ratio_vs_model"]["real"] > 0
    assert result["width"] == 8 and result["threads"] == 1  # the preset, layered over the default config
    saved = json.loads((tmp_path / "bench" / "out" / "epoch.json").read_text())
    assert saved["machine"]["cpu"]["model"]


def test_bench_cores_compares_thread_layouts(ffcv_small, tmp_path, monkeypatch, repo):
    from pipeline.bench import cores

    monkeypatch.chdir(repo)  # workers run `python -m pipeline.bench` from the repository
    monkeypatch.setattr(cores, "write", lambda name, result: tmp_path / f"{name}.json")
    result = cores.main(
        ["--configfile", str(repo / TINY), "--data", str(ffcv_small), "--cores", "2", "--epochs", "1", "--rounds", "1"]
    )
    layouts = result["layouts"]
    assert {(r["jobs"], r["threads"]) for r in layouts.values()} == {(1, 2), (2, 1)}
    assert all(r["steps_per_s"] > 0 for r in layouts.values())
    assert layouts["1 job(s) x 2 thread(s)"]["ratio_vs_one_job"] == 1.0


def test_bench_step_measures_the_floor_beside_the_steps(tmp_path, monkeypatch):
    from pipeline.bench import step

    monkeypatch.chdir(tmp_path)
    result = step.main(["--batch", "16", "--size", "16", "--width", "4", "--rounds", "1"])
    res = result["results"]
    assert set(res) == {"supervised", "moco_v2", "key_forward", "moco_v3", "moco_v2_unguarded"}
    sup, key = res["supervised"]["median_s"], res["key_forward"]["median_s"]
    assert result["moco_v2_measured_floor"] == round((sup + key) / sup, 3)
    assert result["ratio_vs_supervised"]["moco_v2_unguarded"] == round(res["moco_v2_unguarded"]["median_s"] / sup, 3)


def test_bench_step_on_the_fast_path(tmp_path, monkeypatch):
    """--fast-path on: every step in bf16 autocast, channels_last where the model takes it, and
    the split-BN model also timed in channels_last (what the fast path leaves out, and why)."""
    from pipeline.bench import step

    monkeypatch.chdir(tmp_path)
    result = step.main(["--batch", "16", "--size", "16", "--width", "4", "--rounds", "1", "--fast-path", "on"])
    assert "moco_v2_channels_last" in result["results"] and result["split_bn_channels_last_over_contiguous"] > 0
    assert result["fast_path"].startswith("on") and (tmp_path / "bench" / "out" / "step_fast_path.json").is_file()


def test_bench_gpu_dry_runs_the_fast_path_on_cpu(tmp_path, monkeypatch):
    """bench gpu's lines (the Trainer's fast path, FLOP count, MFU) on CPU, tiny sizes."""
    from pipeline.bench import gpu

    monkeypatch.chdir(tmp_path)
    result = gpu.main(["--dry", "--fast-path", "on"])
    assert set(result["results"]) == {"moco_v2_resnet50", "moco_v3_vit_small"} and result["fast_path"] == "on"
    assert all(r["s_per_step"] > 0 and r["img_per_s"] > 0 for r in result["results"].values())
