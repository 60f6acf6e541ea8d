"""Side-by-side timing: candidates run interleaved, round after round, so that the noise of
a shared machine hits them alike; ratios of medians are what we report."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

OUT_DIR = Path("bench/out")


def interleaved(candidates: dict[str, Callable[[], None]], rounds: int, warmup: int = 1) -> dict:
    """Median and all wall times (s) per candidate; each round runs every candidate once."""
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {
        name: {"median_s": statistics.median(t), "min_s": min(t), "times_s": [round(x, 6) for x in t]}
        for name, t in times.items()
    }


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cpu() -> dict:
    """The CPU's model name and vector extensions (/proc/cpuinfo, as lscpu shows them): machines
    of one kind differ (with and without AVX-512), and times mean little without them."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = sorted(f for f in value.split() if f.startswith(("avx", "amx")))
                break
    except OSError:
        pass
    return {"model": model, "vector_flags": flags, "avx512": any(f.startswith("avx512") for f in flags)}


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write(name: str, result: dict, out_dir: Path = OUT_DIR) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2) + "\n")
    return path
