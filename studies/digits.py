"""Real images for the base recipe's held-out check: the UCI handwritten digits that scikit-learn
ships inside its wheel (1,797 scans by 43 writers, 8 x 8 pixels, 17 grey levels, 10 classes),
written as an imagefolder so that the workflow reads them through ``dataset.source: imagefolder``.

They are the only labelled real images this project's machines reach offline (a package
registry), and nothing was designed or chosen on them: the embedded data and the base recipe
were chosen on the embedded training split. scikit-learn is not a dependency of the project, so
the export runs in a Python of its own (it needs numpy and Pillow, not torch):

    python3 -m venv /tmp/sklearn && /tmp/sklearn/bin/pip install scikit-learn pillow
    PYTHONPATH=. /tmp/sklearn/bin/python -m studies.digits --out /tmp/digits
    snakemake --config results=results-digits detect='{enabled: false}' \\
        dataset='{source: imagefolder, root: /tmp/digits}'

Each image is scaled to the embedded images' side (``SIZE``, bilinear), so that the recipe's
crops see objects at the scale it was chosen at; ``VAL_FRACTION`` of each class, drawn with a
fixed seed, goes to ``val``. An export, not a measurement: it writes no ``bench/out`` JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.dag.sections import Synthetic

SIZE = Synthetic().image_size  # the embedded classification images' side, defined once in the config
VAL_FRACTION = 0.2
SPLIT_SEED = 0


def val_mask(labels: np.ndarray, fraction: float = VAL_FRACTION, seed: int = SPLIT_SEED) -> np.ndarray:
    """True for the images that go to ``val``: round(fraction x n) of each class's n, drawn by a
    seeded permutation (the same split on every machine)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        mask[rng.permutation(members)[: round(fraction * len(members))]] = True
    return mask


def export(images: np.ndarray, labels: np.ndarray, out, size: int = SIZE) -> dict:
    """Write ``images`` (n x h x w greys in [0, 1]) as ``out/{train,val}/<label>/<index>.png``,
    RGB at ``size`` x ``size``; returns the images per split."""
    out, to_val = Path(out), val_mask(labels)
    counts = {"train": 0, "val": 0}
    for i, (grey, label, is_val) in enumerate(zip(images, labels, to_val)):
        split = "val" if is_val else "train"
        folder = out / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(np.rint(grey * 255), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels, mode="L").resize((size, size), Image.Resampling.BILINEAR)
        image.convert("RGB").save(folder / f"{i:04d}.png")
        counts[split] += 1
    return counts


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m studies.digits", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the imagefolder root to write (train/ and val/)")
    args = ap.parse_args(argv)
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-not-found]  # not a dependency
    except ImportError:
        need = "needs scikit-learn, which the project does not depend on: pip install scikit-learn"
        raise SystemExit(f"[digits] {need}") from None
    digits = load_digits()
    counts = export(digits.images / digits.images.max(), digits.target, args.out)
    result = {"out": str(args.out), "images": counts, "classes": int(len(np.unique(digits.target))), "side": SIZE}
    print(f"[digits] {counts['train']} train and {counts['val']} val images, {SIZE} px, written to {args.out}")
    return result


if __name__ == "__main__":
    main()
