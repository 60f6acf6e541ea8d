"""The cost of reproducible crops: FFCV's own (unseeded) crop + flip vs the seeded decoder
(pipeline.data.seeded_crop, data.crop: loader) vs crops drawn on the device (data.crop: device).

    python -m pipeline.bench crops [--images 2600 --size 32 --crop 32 --batch 64 --workers 2]

The defaults are the demo's data path (2,600 images of 32 px, 32 px views, batch 64).
Each candidate yields two-view uint8 batches of one epoch; epochs alternate round after round
(pipeline.bench.loader.measure) and the reported times are medians, so the ratios hold on a
shared machine. numba's compilation (first epoch) is reported apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from pipeline.bench.loader import first_epoch, make_beton, make_images, measure, two_view_args
from pipeline.bench.timing import cpu, write


def unseeded_ffcv_loader(beton: Path, batch: int, crop: int, scale_min: float, workers: int, seed: int):
    """FFCV 1.0.2's stock two-view pipeline: its random resized crop decoder + its flip, whose
    draws come from numba's unseeded per-thread RNG (what data.crop: loader was before)."""
    from pipeline.data import ffcv_runtime

    ffcv_runtime.load()
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    from pipeline.data.loaders import RATIO, TwoViewLoader, _int_pipeline

    def ops():
        return [RandomHorizontalFlip(), ToTensor(), ToTorchImage()]

    def decoder():
        return RandomResizedCropRGBImageDecoder((crop, crop), scale=(scale_min, 1.0), ratio=RATIO)

    pipelines = {
        "image": [decoder(), *ops()],
        "label": _int_pipeline(),
        "index": _int_pipeline(),
        "image2": PipelineSpec("image", decoder=decoder(), transforms=ops()),
    }
    return TwoViewLoader(
        Loader(
            str(beton), batch_size=batch, num_workers=workers, order=OrderOption.RANDOM, seed=seed, pipelines=pipelines
        )
    )


def main(argv=None) -> dict:
    from pipeline.data.loaders import two_view_loader

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2600)
    ap.add_argument("--size", type=int, default=32, help="side of the generated images (px)")
    ap.add_argument("--crop", type=int, default=32, help="output side of both views (px)")
    ap.add_argument("--scale-min", type=float, default=0.5, help="the demo's crop_scale_min")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="FFCV decoding threads")
    ap.add_argument("--rounds", type=int, default=5, help="at least this many measured epochs per candidate")
    ap.add_argument("--seconds", type=float, default=5.0, help="and at least this many measured seconds")
    ap.add_argument("--cache", default=None, help="folder for the images and the .beton")
    args = ap.parse_args(argv)

    cache = Path(args.cache or Path(tempfile.gettempdir()) / "moco-bench-crops" / f"n{args.images}-s{args.size}")
    images = make_images(cache, args.images, args.size, 90, args.workers)
    beton = cache / "raw.beton"
    make_beton(images, beton, "raw", args.size, args.workers)
    views, reading = two_view_args(args)
    builders = {
        "ffcv_unseeded": lambda: unseeded_ffcv_loader(beton, args.batch, args.crop, args.scale_min, args.workers, 0),
        "ffcv_seeded": lambda: two_view_loader(beton, dataclasses.replace(views, crop="loader"), reading),
        "device_crop": lambda: two_view_loader(beton, dataclasses.replace(views, crop="device"), reading),
    }
    loaders, warmup = {}, {}
    for name, build in builders.items():
        t0 = time.perf_counter()
        loaders[name] = build()
        warmup[name] = {"init_s": round(time.perf_counter() - t0, 3), **first_epoch(loaders[name])}
    rates = measure(loaders, args.rounds, args.seconds)
    epoch_s = {name: round(args.images / r["samples_per_s"], 3) for name, r in rates.items()}
    base = epoch_s["ffcv_unseeded"]
    ratios = {name: round(t / base, 3) for name, t in epoch_s.items() if name != "ffcv_unseeded"}
    result = {
        "config": vars(args),
        "warmup": warmup,
        "loaders": rates,
        "epoch_s": epoch_s,
        "epoch_time_vs_unseeded": ratios,
        "ratio": ratios["ffcv_seeded"],
        "ratio_of": "ffcv_seeded / ffcv_unseeded (loader epoch time)",
    }
    path = write("crops", result)
    print(
        f"two-view loader epoch, {args.images} images of {args.size} px -> 2 x {args.crop} px, batch {args.batch}, "
        f"{args.workers} threads (median of {min(r['rounds'] for r in rates.values())}+ interleaved epochs):"
    )
    for name, r in rates.items():
        ratio = "" if name == "ffcv_unseeded" else f"   x{ratios[name]:.2f} the unseeded epoch time"
        print(
            f"  {name:<14} {epoch_s[name]:>7.3f} s/epoch  {r['samples_per_s']:>9.0f} samples/s   "
            f"(first epoch {warmup[name]['epoch_s']:.1f} s){ratio}"
        )
    chip = cpu()
    print(f"CPU: {chip['model']} ({', '.join(chip['vector_flags']) or 'no AVX'})   ({path})")
    return result


if __name__ == "__main__":
    main()
