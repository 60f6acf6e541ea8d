"""Convert an image dataset split to an FFCV ``.beton`` (image, label, sample index).

Sources: an ImageFolder tree (one subfolder per class; the embedded default is written in
that layout). Unreadable files are skipped and listed in a JSON report next to the .beton
(``strict`` fails on the first one instead). The .beton is written under a temporary name and
renamed at the end, so an interrupted conversion never leaves a file that looks complete.

    python -m pipeline.convert --root results/data/synthetic/cls/train --out results/data/ffcv/train.beton
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.io import atomic_path, atomic_write_json

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff"}
DEFAULTS = dict(max_resolution=256, jpeg_quality=90, write_mode="smart", workers=1, strict=False)


class ConversionError(RuntimeError):
    pass


def scan_imagefolder(root: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, label) for every image file under root/<class>/, classes sorted by name."""
    if not root.is_dir():
        raise ConversionError(f"dataset root not found: {root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ConversionError(f"{root}: no class folders (expected {root}/<class>/<image>)")
    samples = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ConversionError(f"{root / name}: class '{name}' has no images")
        samples += [(f, label) for f in files]
    return samples, classes


def load_rgb(path: Path) -> np.ndarray:
    """Decode fully (a truncated file fails here, not halfway through writing)."""
    with Image.open(path) as im:
        im.load()
        return np.asarray(im.convert("RGB"))


def check_images(samples, strict: bool):
    """Split samples into readable ones (with their image shapes) and skipped ones."""
    good, skipped, shapes = [], [], []
    for path, label in samples:
        try:
            arr = load_rgb(path)
        except Exception as err:  # PIL raises many types for bad files
            if strict:
                raise ConversionError(f"unreadable image {path}: {err}") from None
            skipped.append({"path": str(path), "reason": f"{type(err).__name__}: {err}"})
            continue
        good.append((path, label))
        shapes.append(arr.shape[:2])
    return good, skipped, shapes


class _ImageDataset:
    """What FFCV's DatasetWriter indexes: (image HxWx3 uint8, label, sample index)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return load_rgb(path), int(label), int(i)


def write_beton(samples, out: Path, opts: dict) -> None:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    fields = {
        "image": RGBImageField(write_mode=opts["write_mode"], max_resolution=opts["max_resolution"],
                               jpeg_quality=opts["jpeg_quality"]),
        "label": IntField(),
        "index": IntField(),
    }
    with atomic_path(out) as tmp:
        # page_size 2 MiB keeps small datasets small (the 8 MiB default pads every page).
        writer = DatasetWriter(str(tmp), fields, num_workers=opts["workers"], page_size=1 << 21)
        writer.from_indexed_dataset(_ImageDataset(samples), chunksize=64)


def convert(root: str | Path, out: str | Path, opts: dict | None = None) -> dict:
    opts = {**DEFAULTS, **(opts or {})}
    root, out = Path(root), Path(out)
    samples, classes = scan_imagefolder(root)
    good, skipped, shapes = check_images(samples, opts["strict"])
    if not good:
        raise ConversionError(f"{root}: no readable images ({len(skipped)} skipped)")
    write_beton(good, out, opts)
    counts = Counter(label for _, label in good)
    hw = np.array(shapes)
    report = {
        "source": str(root), "beton": str(out), "num_samples": len(good), "classes": classes,
        "counts_per_class": {classes[k]: counts.get(k, 0) for k in range(len(classes))},
        "skipped": skipped,
        "resolution": {"min_hw": hw.min(0).tolist(), "max_hw": hw.max(0).tolist(),
                       "mean_hw": [round(float(v), 1) for v in hw.mean(0)]},
        "bytes": out.stat().st_size,
        "options": {k: opts[k] for k in ("max_resolution", "jpeg_quality", "write_mode")},
    }
    atomic_write_json(report, out.with_suffix(".json"))
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="ImageFolder split: <root>/<class>/<image>")
    ap.add_argument("--out", required=True, help="output .beton path (report written next to it)")
    ap.add_argument("--config", default="{}", help="JSON with keys of the convert section")
    ap.add_argument("--strict", action="store_true", help="fail on the first unreadable image")
    args = ap.parse_args(argv)
    opts = json.loads(args.config)
    if args.strict:
        opts["strict"] = True
    try:
        report = convert(args.root, args.out, opts)
    except ConversionError as err:
        raise SystemExit(f"[convert] error: {err}")
    print(f"[convert] {report['num_samples']} images, {len(report['classes'])} classes, "
          f"{len(report['skipped'])} skipped -> {args.out} ({report['bytes'] / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
