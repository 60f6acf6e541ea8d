"""The embedded default dataset: shapes on coloured backgrounds, generated offline.

Classification: ``cls/{train,val}/{class}/{i:05d}.png`` (ImageFolder layout), one shape per
image. Detection: ``det/{train,val}/{i:05d}.png`` with several shapes per image and
``det/instances_{split}.json`` in COCO format, each shape's visible mask as COCO RLE (exact:
the generator draws the shapes). Both follow one design, made for contrastive
learning (docs/embedded-data.md):

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
  the default (docs/studies/2026-12-01-backgrounds.md).
- What varies per image and survives augmentation is the shape's pose and colour: the pose is
  the shape itself, and the colour is jittered by the v2 augmentation (and dropped by its
  grayscale).
- Pixel noise is drawn per image: the crops resample it, so two views do not share it.

``backgrounds: 0`` gives each image its own gradient again (the old design, byte for byte).

**The detection scenes' categories** (``det_shapes``). ``pretraining``: the ten classes, so the
downstream labels are the very labels the supervised baseline was trained to name, and a
transfer test measures that baseline on its own task, not a transfer. ``novel``: ten other shapes
(``NOVEL_SHAPES``) that no classification image shows, a label set disjoint from pretraining's.
What the scenes share with the pretraining images: the renderer (drawn at 4x, box-downsampled),
the colour model (a random colour that contrasts with the background), the background pool and
its pixel noise, the sizes and rotations. What they do not: the categories. Each novel shape is
built from parts the ten classes also have (straight and curved edges, corners, strokes, blobs)
but is none of them under rotation, scale or colour: a star (five points, not a triangle's three),
a crescent (a disk with a bite), an arrow (a shaft with a head), an L and a T (two strokes that
meet at an end, not a plus's centre), three dots, a zigzag stroke, a half disk, a bowtie (two
triangles tip to tip) and a chevron. Disjoint categories are a stricter test than the MoCo
paper's, whose COCO categories overlap ImageNet's in part (person, dog, car).

Each image has its own RNG seeded by (seed, split, class, index): the same seed gives
byte-identical files whatever the order or the number of processes that write them.

    python -m pipeline.synthetic --out results/data/synthetic --config '{"seed": 0, ...}' [--part cls|det]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from pipeline.dag.config import ConfigError, section
from pipeline.dag.sections import DETECTION_SHAPES, SYNTHETIC_CLASSES, SYNTHETIC_PARTS, Synthetic
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
    elif shape in NOVEL_DRAWERS:
        NOVEL_DRAWERS[shape](draw, cx, cy, r, rot, colour, w)
    else:
        raise ValueError(f"unknown shape {shape}")


# --- the novel shapes: the detection scenes' own categories (det_shapes: novel) ---------------
def _star(draw, cx, cy, r, rot, colour, w):
    points = [
        (cx + rr * math.cos(rot + math.pi * k / 5), cy + rr * math.sin(rot + math.pi * k / 5))
        for k in range(10)
        for rr in (r if k % 2 == 0 else r * 0.42,)
    ]
    draw.polygon(points, fill=colour)


def _crescent(draw, cx, cy, r, rot, colour, w):
    # a disk with a bite: the outer arc away from the bite, then the bite's arc back inside it
    d, b = r * 0.55, r * 0.8  # the bite's centre offset and radius
    phi = math.acos((r * r + d * d - b * b) / (2 * r * d))  # where the two circles meet
    bx, by = cx + d * math.cos(rot), cy + d * math.sin(rot)
    meet = (cx + r * math.cos(rot + phi), cy + r * math.sin(rot + phi))
    # the meeting point seen from the bite's centre, relative to rot, in (0, pi)
    alpha = abs((math.atan2(meet[1] - by, meet[0] - bx) - rot + math.pi) % (2 * math.pi) - math.pi)
    outer = [(cx + r * math.cos(rot + a), cy + r * math.sin(rot + a)) for a in np.linspace(phi, 2 * math.pi - phi, 60)]
    inner = [
        (bx + b * math.cos(rot + t), by + b * math.sin(rot + t)) for t in np.linspace(-alpha, alpha - 2 * math.pi, 40)
    ]
    draw.polygon(outer + inner, fill=colour)


def _arrow(draw, cx, cy, r, rot, colour, w):
    shaft = [(-r, -w * 0.6), (r * 0.25, -w * 0.6), (r * 0.25, w * 0.6), (-r, w * 0.6)]
    head = [(r * 0.15, -r * 0.55), (r, 0.0), (r * 0.15, r * 0.55)]
    for part in (shaft, head):
        draw.polygon(_rotate([(cx + x, cy + y) for x, y in part], cx, cy, rot), fill=colour)


def _strokes(draw, cx, cy, rot, colour, w, segments):
    for (x0, y0), (x1, y1) in segments:
        a, b = _rotate([(cx + x0, cy + y0), (cx + x1, cy + y1)], cx, cy, rot)
        draw.line([a, b], fill=colour, width=int(w * 1.3))


def _ell(draw, cx, cy, r, rot, colour, w):
    _strokes(draw, cx, cy, rot, colour, w, [((-r * 0.5, -r), (-r * 0.5, r)), ((-r * 0.5 - w * 0.6, r), (r * 0.6, r))])


def _tee(draw, cx, cy, r, rot, colour, w):
    _strokes(draw, cx, cy, rot, colour, w, [((-r, -r * 0.8), (r, -r * 0.8)), ((0, -r * 0.8), (0, r))])


def _dots(draw, cx, cy, r, rot, colour, w):
    d = r * 0.3
    for x, y in _polygon(cx, cy, r * 0.62, 3, rot):
        draw.ellipse([x - d, y - d, x + d, y + d], fill=colour)


def _zigzag(draw, cx, cy, r, rot, colour, w):
    xs = np.linspace(-r, r, 5)
    points = _rotate([(cx + x, cy + (r * 0.45 if k % 2 else -r * 0.45)) for k, x in enumerate(xs)], cx, cy, rot)
    draw.line(points, fill=colour, width=int(w * 1.3), joint="curve")


def _half_disk(draw, cx, cy, r, rot, colour, w):
    arc = np.linspace(rot, rot + math.pi, 48)
    draw.polygon([(cx + r * math.cos(a), cy + r * math.sin(a)) for a in arc], fill=colour)


def _bowtie(draw, cx, cy, r, rot, colour, w):
    for side in (-1, 1):
        tri = [(cx, cy), (cx + side * r, cy - r * 0.7), (cx + side * r, cy + r * 0.7)]
        draw.polygon(_rotate(tri, cx, cy, rot), fill=colour)


def _chevron(draw, cx, cy, r, rot, colour, w):
    points = [(-r * 0.9, -r * 0.6), (r * 0.8, 0.0), (-r * 0.9, r * 0.6)]  # ~40 degrees: not an L's 90
    draw.line(
        _rotate([(cx + x, cy + y) for x, y in points], cx, cy, rot), fill=colour, width=int(w * 1.6), joint="curve"
    )


NOVEL_DRAWERS = {
    "star": _star,
    "crescent": _crescent,
    "arrow": _arrow,
    "ell": _ell,
    "tee": _tee,
    "dots": _dots,
    "zigzag": _zigzag,
    "half_disk": _half_disk,
    "bowtie": _bowtie,
    "chevron": _chevron,
}


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


def detection_scene(seed: int, split: str, index: int, size: int, pool: int = POOL, shapes=CLASSES):
    """One scene: 2-4 of ``shapes`` (the categories, in label order), little overlap. Returns the
    image, [(label, x, y, w, h)] and each shape's visible mask (bool HxW)."""
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
        label = int(rng.integers(0, len(shapes)))
        placed.append((cx, cy, r))
        boxes.append((label, cx, cy, r, rng.uniform(0, 2 * math.pi)))
    drawn = [(shapes[label], cx, cy, r, rot) for label, cx, cy, r, rot in boxes]
    img, tight, masks = render(drawn, size, rng, _background_of(seed, pool, rng))
    ann = [
        (label, round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2))
        for (label, *_), (x0, y0, x1, y1) in zip(boxes, tight)
    ]
    return img, ann, masks


def coco_categories(shapes=CLASSES) -> list[dict]:
    return [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(shapes)]


def run(out: str | Path, cfg: Synthetic | None = None, progress: bool = True, parts=tuple(SYNTHETIC_PARTS)) -> dict:
    """Write ``parts`` of the dataset (``cls``, ``det``) under ``out``, each with a manifest
    (``<part>/manifest.json``: its keys, its categories, its counts); returns them by part.
    ``cfg``: dataset.synthetic (None: the defaults). A part reads only its own keys
    (``SYNTHETIC_PARTS``), so the workflow regenerates one without touching the other."""
    cfg = cfg or Synthetic()
    out = Path(out)
    writers = {"cls": _write_classification, "det": _write_scenes}
    manifests = {}
    for part in parts:
        categories, counts = writers[part](out / part, cfg, progress)
        manifests[part] = {
            "generator": "pipeline.synthetic",
            "part": part,
            "config": cfg.part(part),
            "categories": list(categories),
            "counts": counts,
        }
        atomic_write_json(manifests[part], out / part / "manifest.json")
    return manifests


def _write_classification(out: Path, cfg: Synthetic, progress: bool) -> tuple[tuple, dict]:
    """``{train,val}/<class>/<i>.png``: one shape per image, the ten classes."""
    from tqdm import tqdm

    counts: dict[str, int] = {}
    jobs = [
        (split, label, i)
        for split, n in (("train", cfg.train_per_class), ("val", cfg.val_per_class))
        for label in range(len(CLASSES))
        for i in range(n)
    ]
    for split, label, i in tqdm(jobs, desc="synthetic: classification", disable=not progress, mininterval=2):
        path = out / split / CLASSES[label] / f"{i:05d}.png"
        atomic_save_png(classification_image(cfg.seed, split, label, i, cfg.image_size, cfg.backgrounds), path)
        counts[split] = counts.get(split, 0) + 1
    return CLASSES, counts


def _write_scenes(out: Path, cfg: Synthetic, progress: bool) -> tuple[tuple, dict]:
    """``{train,val}/<i>.png`` scenes of several shapes and ``instances_{split}.json`` (COCO,
    each shape's visible mask as RLE), of the categories ``det_shapes`` names."""
    from tqdm import tqdm

    counts: dict[str, int] = {}
    dsize, shapes = cfg.det_image_size, DETECTION_SHAPES[cfg.det_shapes]
    for split, n in (("train", cfg.det_train_images), ("val", cfg.det_val_images)):
        images: list[dict] = []
        annotations: list[dict] = []
        for i in tqdm(range(n), desc=f"synthetic: detection {split}", disable=not progress, mininterval=2):
            img, boxes, masks = detection_scene(cfg.seed, split, i, dsize, cfg.backgrounds, shapes)
            name = f"{split}/{i:05d}.png"
            atomic_save_png(img, out / name)
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
            {"images": images, "annotations": annotations, "categories": coco_categories(shapes)},
            out / f"instances_{split}.json",
        )
        counts[split] = n
    return shapes, counts


def category_sheet(path: str | Path, tile: int = 96) -> None:
    """A picture of the categories: the ten classes (top row), the novel scene shapes (bottom),
    each drawn alone by ``render`` on one dark gradient (docs/segmentation.md's figure)."""
    rows = [SYNTHETIC_CLASSES, DETECTION_SHAPES["novel"]]
    sheet = Image.new("RGB", (tile * len(rows[0]), tile * len(rows)))
    dark = ((24, 24, 24), (64, 64, 64), 0.0)
    for y, shapes in enumerate(rows):
        for x, shape in enumerate(shapes):
            rng = np.random.default_rng([y, x])
            img, _, _ = render([(shape, tile / 2, tile / 2, tile * 0.3, 0.3)], tile, rng, dark)
            sheet.paste(img, (x * tile, y * tile))
    sheet.save(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--config", default="{}", help="JSON with keys of dataset.synthetic")
    ap.add_argument("--sheet", metavar="PNG", help="draw the categories of both parts into this picture instead")
    ap.add_argument(
        "--part",
        choices=list(SYNTHETIC_PARTS),
        action="append",
        help="write only this part (cls: classification images, det: detection scenes); repeatable; default both",
    )
    args = ap.parse_args(argv)
    if args.sheet:
        category_sheet(args.sheet)
        return
    if not args.out:
        ap.error("--out is required (or --sheet)")
    try:
        cfg = section("dataset", {"synthetic": json.loads(args.config)}).synthetic
    except ConfigError as err:
        raise SystemExit(f"[synthetic] error: {err}") from None
    for part, manifest in run(args.out, cfg, parts=args.part or tuple(SYNTHETIC_PARTS)).items():
        print(f"[synthetic] wrote {part}/ {manifest['counts']} to {args.out}")


if __name__ == "__main__":
    main()
