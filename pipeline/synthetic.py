"""The embedded default dataset: shapes on coloured backgrounds, generated offline.

Classification: ``cls/{train,val}/{class}/{i:05d}.png`` (ImageFolder layout), one shape per
image. Detection: ``det/{train,val}/{i:05d}.png`` with several shapes per image and
``det/instances_{split}.json`` in COCO format, each shape's visible mask as COCO RLE (exact:
the generator draws the shapes). Both follow one design, made for contrastive
learning (issue 34):

- **The class is the shape**, and nothing else: ten shapes, each drawn at a random position,
  scale, rotation and colour.
- **Everything else is nuisance**, and no nuisance may identify an image through the two views'
  augmentations. MoCo learns whatever tells an image apart from the others in the queue while
  surviving its augmentations: a feature that does so more easily than the shape suppresses it
  (Chen, Luo & Li, "Intriguing properties of contrastive losses", NeurIPS 2021). The old design
  gave every image its own background gradient (two random colours, an angle), covering most
  of its pixels: it survives the crops and the v2 colour jitter (hue ±0.1) and tells 2,600
  images apart by itself, so the encoder never needed the shape (linear top-1 near random init
  on some seeds). Now the images draw their gradient from a **shared pool** of
  ``backgrounds`` gradients; by default one, shared by every image. It still clutters every
  image (a crop's background depends on where the crop and the shape fall), so that untrained
  features stay far from the class, but it tells nothing about which image a view came from.
  Each bit a pool tells cost MoCo 8-10 points of held-out linear top-1 in the study that chose
  the default (docs/embedded-data.md).
- What varies per image and survives augmentation is the shape's pose and colour: the pose is
  the shape itself, and the colour is jittered by the v2 augmentation (and dropped by its
  grayscale).
- Pixel noise is drawn per image: the crops resample it, so two views do not share it.

``backgrounds: 0`` gives each image its own gradient again (the old design, byte for byte).

Each image has its own RNG seeded by (seed, split, class, index): the same seed gives
byte-identical files whatever the order or the number of processes that write them.

    python -m pipeline.synthetic --out results/data/synthetic --config '{"seed": 0, ...}'
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipeline.dag.config import ConfigError, section, to_dict
from pipeline.dag.sections import SYNTHETIC_CLASSES, Synthetic
from pipeline.eval import masks as masks_io
from pipeline.runtime.io import atomic_save_png, atomic_write_json

CLASSES = SYNTHETIC_CLASSES  # in label order
SPLIT_IDS = {"train": 0, "val": 1}
SUPERSAMPLE = 4  # draw at 4x and downsample: smooth edges, still deterministic
POOL = Synthetic().backgrounds  # the default pool of background gradients
POOL_STREAM = 99  # RNG stream of the shared background pool, apart from every split's


def _rgb(rng) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in rng.integers(0, 256, size=3))
    return r, g, b


def _luma(c) -> float:
    return (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) / 255.0


def _contrasting_colour(rng, background) -> tuple[int, int, int]:
    for _ in range(100):
        c = _rgb(rng)
        if abs(_luma(c) - _luma(background)) > 0.25:
            return c
    return (255, 255, 255) if _luma(background) < 0.5 else (0, 0, 0)


def _gradient(rng) -> tuple[tuple, tuple, float]:
    """A background gradient's parameters: two colours and an angle."""
    return _rgb(rng), _rgb(rng), rng.uniform(0, 2 * math.pi)


def _background_of(seed: int, pool: int, rng) -> tuple[tuple, tuple, float]:
    """The image's gradient: one of the dataset's shared pool of ``pool`` (drawn with the image's
    RNG), or, with ``pool`` 0, its own (the old design: a per-image signature, see the docstring)."""
    if pool == 0:
        return _gradient(rng)
    return _gradient(np.random.default_rng([seed, POOL_STREAM, int(rng.integers(0, pool))]))


def _background(gradient, rng, size: int) -> tuple[np.ndarray, tuple]:
    """The gradient plus pixel noise: a nuisance the encoder must learn to ignore."""
    c0, c1, angle = np.array(gradient[0], float), np.array(gradient[1], float), gradient[2]
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    t = np.cos(angle) * xx + np.sin(angle) * yy
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    img += rng.normal(0, 12, size=img.shape)
    mean = tuple(int(v) for v in img.reshape(-1, 3).mean(0))
    return np.clip(img, 0, 255).astype(np.uint8), mean


def _polygon(cx, cy, r, n, rot):
    return [
        (cx + r * math.cos(rot + 2 * math.pi * k / n), cy + r * math.sin(rot + 2 * math.pi * k / n)) for k in range(n)
    ]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx, cy, r, rot, colour) -> None:
    """Draw one shape of radius r centred at (cx, cy) (all in supersampled pixels)."""
    w = max(r * 0.28, 1.5)
    if shape == "disk":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=int(w))
    elif shape == "square":
        draw.polygon(_polygon(cx, cy, r * 1.2, 4, rot + math.pi / 4), fill=colour)
    elif shape == "frame":
        draw.polygon(_polygon(cx, cy, r * 1.2, 4, rot + math.pi / 4), outline=colour, width=int(w))
    elif shape == "diamond":
        pts = [(cx, cy - r), (cx + r * 0.6, cy), (cx, cy + r), (cx - r * 0.6, cy)]
        draw.polygon(_rotate(pts, cx, cy, _small_tilt(rot)), fill=colour)
    elif shape == "triangle":
        draw.polygon(_polygon(cx, cy, r, 3, rot), fill=colour)
    elif shape in ("plus", "cross"):
        base = _small_tilt(rot) + (math.pi / 4 if shape == "cross" else 0.0)
        for a in (base, base + math.pi / 2):
            dx, dy = r * math.cos(a), r * math.sin(a)
            draw.line([(cx - dx, cy - dy), (cx + dx, cy + dy)], fill=colour, width=int(w * 1.3))
    elif shape == "bars":
        for k in (-1, 0, 1):
            y = cy + k * r * 0.65
            draw.rectangle([cx - r, y - w * 0.6, cx + r, y + w * 0.6], fill=colour)
    elif shape == "checker":
        cell = r / 2
        for i in range(4):
            for j in range(4):
                if (i + j) % 2 == 0:
                    x0, y0 = cx - r + i * cell, cy - r + j * cell
                    draw.rectangle([x0, y0, x0 + cell, y0 + cell], fill=colour)
    else:
        raise ValueError(f"unknown shape {shape}")


def _small_tilt(rot: float) -> float:
    """At most +-15 degrees: plus and cross (and diamond's axis) must stay distinguishable."""
    return (rot / (2 * math.pi) - 0.5) * math.radians(30)


def _rotate(points, cx, cy, a):
    c, s = math.cos(a), math.sin(a)
    return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in points]


def render(shapes: list[tuple[str, float, float, float, float]], size: int, rng, gradient):
    """Render shapes [(name, cx, cy, r, rot)] (output pixels) onto the background ``gradient``.

    Returns the image, each shape's tight box (x0, y0, x1, y1) in output pixels and each
    shape's instance mask (``visible_masks``).
    """
    s = SUPERSAMPLE
    bg, mean = _background(gradient, rng, size * s)
    img = Image.fromarray(bg)
    draw = ImageDraw.Draw(img)
    boxes, drawn = [], []
    for name, cx, cy, r, rot in shapes:
        colour = _contrasting_colour(rng, mean)
        _draw_shape(draw, name, cx * s, cy * s, r * s, rot, colour)
        mask = Image.new("L", img.size)
        _draw_shape(ImageDraw.Draw(mask), name, cx * s, cy * s, r * s, rot, 255)
        bbox = mask.getbbox()
        assert bbox is not None  # a shape drawn inside the image covers some pixels
        x0, y0, x1, y1 = bbox
        boxes.append((x0 / s, y0 / s, x1 / s, y1 / s))
        drawn.append(np.asarray(mask) > 0)
    return img.resize((size, size), Image.Resampling.BOX), boxes, visible_masks(drawn, s)


def visible_masks(drawn: list[np.ndarray], s: int) -> list[np.ndarray]:
    """Each shape's pixels in the output image (bool HxW): those it covers at least half of
    after the shapes drawn over it (the image is the s x s box average of the drawing, so a
    pixel's colour is mostly the shape's exactly where the mask is set)."""
    out: list[np.ndarray] = []
    above = None  # the union of the shapes drawn after this one
    for sub in reversed(drawn):  # the last shape drawn is on top
        size = sub.shape[0] // s
        visible = sub if above is None else sub & ~above
        out.append(visible.reshape(size, s, size, s).mean((1, 3)) >= 0.5)
        above = sub if above is None else above | sub
    return out[::-1]


def classification_image(seed: int, split: str, label: int, index: int, size: int, pool: int = POOL) -> Image.Image:
    rng = np.random.default_rng([seed, SPLIT_IDS[split], label, index])
    r = rng.uniform(0.22, 0.42) * size
    cx, cy = rng.uniform(r, size - r, size=2)
    shape = (CLASSES[label], cx, cy, r, rng.uniform(0, 2 * math.pi))
    return render([shape], size, rng, _background_of(seed, pool, rng))[0]


def detection_scene(seed: int, split: str, index: int, size: int, pool: int = POOL):
    """One scene: 2-4 shapes, little overlap. Returns the image, [(label, x, y, w, h)] and each
    shape's visible mask (bool HxW)."""
    rng = np.random.default_rng([seed, 10 + SPLIT_IDS[split], index])
    placed: list[tuple] = []
    boxes: list[tuple] = []
    for _ in range(int(rng.integers(2, 5))):
        for _attempt in range(30):
            r = rng.uniform(0.09, 0.2) * size
            cx, cy = rng.uniform(r + 1, size - r - 1, size=2)
            if all(math.hypot(cx - px, cy - py) > (r + pr) * 0.95 for px, py, pr in placed):
                break
        else:
            continue
        label = int(rng.integers(0, len(CLASSES)))
        placed.append((cx, cy, r))
        boxes.append((label, cx, cy, r, rng.uniform(0, 2 * math.pi)))
    shapes = [(CLASSES[label], cx, cy, r, rot) for label, cx, cy, r, rot in boxes]
    img, tight, masks = render(shapes, size, rng, _background_of(seed, pool, rng))
    ann = [
        (label, round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2))
        for (label, *_), (x0, y0, x1, y1) in zip(boxes, tight)
    ]
    return img, ann, masks


def coco_categories() -> list[dict]:
    return [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]


def run(out: str | Path, cfg: Synthetic | None = None, progress: bool = True) -> dict:
    """Write the whole dataset under ``out``; returns the manifest (also written). ``cfg``:
    dataset.synthetic (None: the defaults)."""
    from tqdm import tqdm

    cfg = cfg or Synthetic()
    out = Path(out)
    counts: dict[str, int] = {}
    size, seed = cfg.image_size, cfg.seed
    jobs = [
        (split, label, i)
        for split, n in (("train", cfg.train_per_class), ("val", cfg.val_per_class))
        for label in range(len(CLASSES))
        for i in range(n)
    ]
    for split, label, i in tqdm(jobs, desc="synthetic: classification", disable=not progress, mininterval=2):
        path = out / "cls" / split / CLASSES[label] / f"{i:05d}.png"
        atomic_save_png(classification_image(seed, split, label, i, size, cfg.backgrounds), path)
        counts[f"cls/{split}"] = counts.get(f"cls/{split}", 0) + 1

    dsize = cfg.det_image_size
    for split, n in (("train", cfg.det_train_images), ("val", cfg.det_val_images)):
        images: list[dict] = []
        annotations: list[dict] = []
        for i in tqdm(range(n), desc=f"synthetic: detection {split}", disable=not progress, mininterval=2):
            img, boxes, masks = detection_scene(seed, split, i, dsize, cfg.backgrounds)
            name = f"{split}/{i:05d}.png"
            atomic_save_png(img, out / "det" / name)
            images.append({"id": i + 1, "file_name": name, "width": dsize, "height": dsize})
            for (label, x, y, w, h), mask in zip(boxes, masks):
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": i + 1,
                        "category_id": label + 1,
                        "bbox": [x, y, w, h],
                        "area": int(mask.sum()),  # COCO's area: the mask's (its small/medium/large)
                        "segmentation": masks_io.to_rle(mask),
                        "iscrowd": 0,
                    }
                )
        atomic_write_json(
            {"images": images, "annotations": annotations, "categories": coco_categories()},
            out / "det" / f"instances_{split}.json",
        )
        counts[f"det/{split}"] = n
    manifest = {"generator": "pipeline.synthetic", "config": to_dict(cfg), "classes": CLASSES, "counts": counts}
    atomic_write_json(manifest, out / "manifest.json")
    return manifest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--config", default="{}", help="JSON with keys of dataset.synthetic")
    args = ap.parse_args(argv)
    try:
        cfg = section("dataset", {"synthetic": json.loads(args.config)}).synthetic
    except ConfigError as err:
        raise SystemExit(f"[synthetic] error: {err}") from None
    manifest = run(args.out, cfg)
    print(f"[synthetic] wrote {manifest['counts']} to {args.out}")


if __name__ == "__main__":
    main()
