"""Two-view loading throughput: FFCV vs a torchvision DataLoader, on the same images.

    python -m pipeline.bench loader [--images 3000 --size 96 --crop 64 --batch 256 --workers 2]

Generates a synthetic ImageFolder of JPEG files once (cached under the temp folder), converts
it to .beton files (one per write mode), then measures two-view samples per second of each
loader at the same crop size, scale range, workers and batch size: random resized crop + flip
of two views per image, uint8 batches out. Epochs of the loaders alternate, round after round,
so that the noise of a shared machine hits them alike; rates are medians over rounds.

Left out of the rates and reported apart: FFCV's numba compilation (its first epoch) and the
DataLoader's worker start-up (its first epoch). The photometric augmentation (kornia, run on
the training device on the loader's batches) is timed separately: on a CPU it can cost more
than decoding and cropping.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from pipeline.bench.timing import write
from pipeline.dag.sections import Convert
from pipeline.data.loaders import Reading, Views

CLASSES = 10
IMAGES_PER_TASK = 64  # images a pool worker writes per task


def _save_image(job) -> None:
    from pipeline.synthetic import CLASSES as NAMES
    from pipeline.synthetic import classification_image

    folder, label, i, size, quality = job
    path = Path(folder) / NAMES[label] / f"{i:05d}.jpg"
    classification_image(0, "train", label, i, size).save(path, quality=quality)


def make_images(folder: Path, n: int, size: int, quality: int, workers: int) -> Path:
    """An ImageFolder of n JPEGs (embedded shapes at size px), written once and reused."""
    from pipeline.synthetic import CLASSES as NAMES

    done = folder / "done.json"
    if done.is_file():
        return folder / "images"
    for name in NAMES[:CLASSES]:
        (folder / "images" / name).mkdir(parents=True, exist_ok=True)
    jobs = [(str(folder / "images"), i % CLASSES, i // CLASSES, size, quality) for i in range(n)]
    if workers <= 1 or n <= workers * IMAGES_PER_TASK:  # a pool would not share the work out
        for job in jobs:
            _save_image(job)
    else:
        # spawn, not fork: the caller may have threads (torch's, FFCV's, a test runner's), and a
        # forked worker hung once in the test suite, its pool never joined
        with get_context("spawn").Pool(workers) as pool:
            pool.map(_save_image, jobs, chunksize=IMAGES_PER_TASK)
    done.write_text(json.dumps({"images": n, "size": size, "quality": quality}))
    return folder / "images"


def make_beton(images: Path, out: Path, mode: str, size: int, workers: int) -> dict:
    from pipeline.convert import run as convert

    report = out.with_suffix(".json")
    if out.is_file() and report.is_file():
        return json.loads(report.read_text())
    opts = Convert(write_mode=mode, max_resolution=size, workers=workers)
    return convert(images, out, opts, progress=False)


def two_view_args(args) -> tuple[Views, Reading]:
    """two_view_loader's views and reading from a benchmark's --batch, --crop, --scale-min and --workers."""
    views = Views(crop_size=args.crop, scale_min=args.scale_min, seed=0)
    return views, Reading(batch_size=args.batch, workers=args.workers, threads=args.workers)


def run_epoch(loader) -> tuple[int, float]:
    """(two-view samples, seconds) of one full epoch."""
    n, t0 = 0, time.perf_counter()
    for v1, _v2, _, _ in loader.batches():
        n += v1.shape[0]
    return n, time.perf_counter() - t0


def first_epoch(loader) -> dict:
    """The warm-up epoch: time to the first batch (FFCV: numba compilation; torch: worker
    start-up) and of the whole epoch."""
    t0 = time.perf_counter()
    it = loader.batches()
    next(it)
    first = time.perf_counter() - t0
    for _ in it:
        pass
    return {"first_batch_s": round(first, 3), "epoch_s": round(time.perf_counter() - t0, 3)}


def measure(loaders: dict, rounds: int, seconds: float) -> dict:
    """Alternate full epochs of every loader until each ran ``rounds`` epochs and ``seconds``."""
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    spent = {name: 0.0 for name in loaders}
    while min(len(r) for r in rates.values()) < rounds or min(spent.values()) < seconds:
        for name, loader in loaders.items():
            n, dt = run_epoch(loader)
            rates[name].append(n / dt)
            spent[name] += dt
    return {
        name: {
            "samples_per_s": round(statistics.median(r), 1),
            "rounds": len(r),
            "all_samples_per_s": [round(x, 1) for x in r],
        }
        for name, r in rates.items()
    }


def photometric_rate(batch: torch.Tensor, recipe: str, crop: int, threads: int, seconds: float) -> dict:
    """Two-view samples/s of the kornia recipe alone (both views) on uint8 batches."""
    from pipeline.data.augment import view_recipes

    torch.set_num_threads(threads)
    aug1, aug2 = view_recipes(recipe, crop)
    for _ in range(2):
        aug1(batch), aug2(batch)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n == 0:
        aug1(batch), aug2(batch)
        n += batch.shape[0]
    return {"recipe": recipe, "threads": threads, "samples_per_s": round(n / (time.perf_counter() - t0), 1)}


def main(argv=None) -> dict:
    from pipeline.data.loaders import two_view_loader

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--size", type=int, default=96, help="side of the generated images (px)")
    ap.add_argument("--crop", type=int, default=64, help="output side of both views (px)")
    ap.add_argument("--scale-min", type=float, default=0.2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="FFCV threads = DataLoader worker processes")
    ap.add_argument(
        "--write-modes",
        default="auto,jpg",
        help="one FFCV loader per .beton write mode (auto = raw pixels at this size)",
    )
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality of the source files")
    ap.add_argument("--rounds", type=int, default=3, help="at least this many measured epochs per loader")
    ap.add_argument("--seconds", type=float, default=5.0, help="and at least this many measured seconds")
    ap.add_argument("--aug", default="v2", help="photometric recipe timed separately ('' to skip)")
    ap.add_argument("--cache", default=None, help="folder for the images and .beton files")
    args = ap.parse_args(argv)

    cache = Path(
        args.cache or Path(tempfile.gettempdir()) / "moco-bench-loader" / f"n{args.images}-s{args.size}-q{args.quality}"
    )
    t0 = time.perf_counter()
    images = make_images(cache, args.images, args.size, args.quality, args.workers)
    setup = {"images_s": round(time.perf_counter() - t0, 1)}
    modes = [m for m in args.write_modes.split(",") if m]
    betons = {}
    for mode in modes:
        t0 = time.perf_counter()
        report = make_beton(images, cache / f"{mode}.beton", mode, args.size, args.workers)
        betons[f"ffcv_{mode}"] = (cache / f"{mode}.beton", report)
        setup[f"convert_{mode}_s"] = round(time.perf_counter() - t0, 1)

    views, reading = two_view_args(args)
    loaders, warmup = {}, {}
    for name, (beton, _) in betons.items():
        t0 = time.perf_counter()
        loaders[name] = two_view_loader(beton, views, dataclasses.replace(reading, loader="ffcv"))
        warmup[name] = {"init_s": round(time.perf_counter() - t0, 3), **first_epoch(loaders[name])}
    first_beton = next(iter(betons.values()))[0]
    t0 = time.perf_counter()
    loaders["torchvision"] = two_view_loader(first_beton, views, dataclasses.replace(reading, loader="torchvision"))
    warmup["torchvision"] = {"init_s": round(time.perf_counter() - t0, 3), **first_epoch(loaders["torchvision"])}

    rates = measure(loaders, args.rounds, args.seconds)
    base = rates["torchvision"]["samples_per_s"]
    ratios = {name: round(r["samples_per_s"] / base, 2) for name, r in rates.items() if name != "torchvision"}
    headline = next(iter(ratios))

    result = {
        "config": vars(args),
        "cache": str(cache),
        "setup_s": setup,
        "write_modes": {name: rep["options"]["write_mode"] for name, (_, rep) in betons.items()},
        "beton_bytes": {name: rep["bytes"] for name, (_, rep) in betons.items()},
        "warmup": warmup,
        "loaders": rates,
        "ratio_vs_torchvision": ratios,
        "ratio": ratios[headline],
        "ratio_of": f"{headline} / torchvision",
    }
    if args.aug:
        batch = next(loaders[headline].batches())[0].clone()
        photo = photometric_rate(batch, args.aug, args.crop, args.workers, min(args.seconds, 5.0))
        # The training loop runs loading and photometric augmentation one after the other on
        # a CPU: the combined rate is the harmonic combination of the two.
        photo["combined_samples_per_s"] = {
            name: round(1 / (1 / r["samples_per_s"] + 1 / photo["samples_per_s"]), 1) for name, r in rates.items()
        }
        result["photometric"] = photo
    path = write("loader", result)

    print(
        f"two-view loading, {args.images} images of {args.size} px -> 2 x {args.crop} px crops, "
        f"batch {args.batch}, {args.workers} workers:"
    )
    for name, r in rates.items():
        w = warmup[name]
        print(
            f"  {name:<14} {r['samples_per_s']:>9.0f} samples/s   (warm-up: first batch {w['first_batch_s']:.1f} s, "
            f"epoch {w['epoch_s']:.1f} s)"
        )
    if args.aug:
        print(
            f"  photometric {args.aug} (kornia, both views, {args.workers} threads): "
            f"{result['photometric']['samples_per_s']:.0f} samples/s"
        )
    print(f"ratio {headline} / torchvision: x{result['ratio']:.2f}   ({path})")
    return result


if __name__ == "__main__":
    main()
