"""The embedded dataset is deterministic: the same seed gives byte-identical files."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.dag.sections import Synthetic
from pipeline.synthetic import CLASSES
from pipeline.synthetic import run as generate

SMALL = Synthetic(train_per_class=2, val_per_class=1, det_train_images=3, det_val_images=2, det_image_size=48)


def digest(root):
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes(tmp_path):
    a, b = generate(tmp_path / "a", SMALL, progress=False), generate(tmp_path / "b", SMALL, progress=False)
    assert a == b
    da, db = digest(tmp_path / "a"), digest(tmp_path / "b")
    assert da == db and len(da) == 10 * 3 + 5 + 4  # images + 2 COCO files + a manifest per part


def test_other_seed_other_images(tmp_path):
    generate(tmp_path / "a", SMALL, progress=False)
    generate(tmp_path / "b", replace(SMALL, seed=1), progress=False)
    a, b = digest(tmp_path / "a"), digest(tmp_path / "b")
    assert a["cls/train/disk/00000.png"] != b["cls/train/disk/00000.png"]


def test_layout_and_coco(tmp_path):
    generate(tmp_path, SMALL, progress=False)
    assert sorted(p.name for p in (tmp_path / "cls" / "train").iterdir()) == sorted(CLASSES)
    coco = json.loads((tmp_path / "det" / "instances_train.json").read_text())
    assert len(coco["images"]) == 3 and len(coco["categories"]) == len(CLASSES)
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        assert 0 <= x and 0 <= y and x + w <= 48 + 1e-6 and y + h <= 48 + 1e-6 and w > 2 and h > 2
        assert 1 <= ann["category_id"] <= len(CLASSES)


def test_backgrounds_come_from_a_shared_pool():
    """With a pool of 3, every image's gradient is one of 3, whichever image draws it; with 0,
    each image has its own (the old design)."""
    import numpy as np

    from pipeline.synthetic import _background_of

    pooled = {_background_of(7, 3, np.random.default_rng([7, 0, label, i])) for label in range(10) for i in range(20)}
    assert len(pooled) == 3
    own = {_background_of(7, 0, np.random.default_rng([7, 0, label, i])) for label in range(10) for i in range(20)}
    assert len(own) == 200


def test_pooled_backgrounds_share_pixels_across_images(tmp_path):
    """A pool of one: two images' corners differ only by the per-image noise (sigma 12 drawn at 4x,
    box-averaged over 16 pixels: sigma 3, so |a - b| averages 2 * 3 / sqrt(pi) = 3.4), far less
    than two images with their own gradients (two random colours apart)."""
    import numpy as np

    from pipeline.synthetic import classification_image

    def corner_gap(pool):  # mean |a - b| over 4x4 corners that the shape leaves free in both
        gaps = []
        for i in range(10):
            a, b = (np.asarray(classification_image(0, "train", 0, j, 32, pool), float) for j in (2 * i, 2 * i + 1))
            for ys, xs in ((slice(0, 4), slice(0, 4)), (slice(28, 32), slice(28, 32))):
                gaps.append(np.abs(a[ys, xs] - b[ys, xs]).mean())
        return float(np.median(gaps))

    assert corner_gap(1) < 5 and corner_gap(0) > 30


# --- instance masks (issue 36): known to the pixel, since the generator draws the shapes -------
def _render_one(shape, r, size=48):
    import numpy as np

    from pipeline.synthetic import render

    rng = np.random.default_rng(0)
    _, boxes, masks = render([(shape, size / 2, size / 2, r, 0.3)], size, rng, ((0, 0, 0), (255, 255, 255), 0.0))
    return boxes[0], masks[0]


def test_a_disk_mask_has_the_disk_area():
    """Area of a disk of radius 10 px: pi r^2 = 314.2. Thresholding each pixel's coverage at 1/2
    errs by at most 1/2 px on each pixel the edge crosses, and a convex outline inside a
    20 x 20 px box crosses at most 2 * (21 + 21) = 84 pixels: |error| <= 42. A filled box would
    be 400 and the 4x drawing 16 x 314: both fail."""
    import math

    _, mask = _render_one("disk", 10)
    assert abs(int(mask.sum()) - math.pi * 10**2) <= 42


def test_a_square_mask_has_the_square_area():
    """The square is a 4-gon of circumradius 1.2 r: its side is 1.2 r sqrt 2, its area
    2 (1.2 r)^2 = 288 px for r = 10 (its box, rotated, is larger: the bound as for the disk,
    with a box of at most 34 px a side: 2 * (35 + 35) / 2 = 70)."""
    _, mask = _render_one("square", 10)
    assert abs(int(mask.sum()) - 2 * (1.2 * 10) ** 2) <= 70


def test_the_mask_fills_the_box_annotation():
    """The box is the drawing's tight box (4x pixels / 4): the mask's box lies within one pixel
    of it, and inside it rounded out to whole pixels."""
    import math

    import numpy as np

    for shape in ("disk", "triangle", "ring", "cross", "checker"):
        (x0, y0, x1, y1), mask = _render_one(shape, 12)
        ys, xs = np.nonzero(mask)
        mx0, my0, mx1, my1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        assert math.floor(x0) <= mx0 <= x0 + 1 and math.floor(y0) <= my0 <= y0 + 1, shape
        assert x1 - 1 <= mx1 <= math.ceil(x1) and y1 - 1 <= my1 <= math.ceil(y1), shape


def test_a_shape_drawn_over_another_takes_its_pixels():
    """Drawn at 2x: shape A covers the 4x4 drawing pixels of rows/columns 0-3, shape B (drawn
    after, on top) rows/columns 2-5. Output pixels are 2x2 blocks: A keeps the block (0,0) and
    B holds the 2x2 blocks (1..2, 1..2); A's blocks (0,1), (1,0) are half its own (>= 1/2: kept),
    (1,1) is B's."""
    import numpy as np

    from pipeline.synthetic import visible_masks

    a, b = np.zeros((6, 6), bool), np.zeros((6, 6), bool)
    a[0:4, 0:4], b[2:6, 2:6] = True, True
    va, vb = visible_masks([a, b], 2)
    assert va.tolist() == [[True, True, False], [True, False, False], [False, False, False]]
    assert vb.tolist() == [[False, False, False], [False, True, True], [False, True, True]]


def test_coco_json_carries_each_instance_mask(tmp_path):
    """Each annotation's RLE decodes to an image-sized mask whose pixel count is its area and
    which lies inside its box rounded out; an image's masks are disjoint."""
    import math

    import numpy as np
    from pycocotools import mask as mask_utils

    generate(tmp_path, SMALL, progress=False)
    coco = json.loads((tmp_path / "det" / "instances_val.json").read_text())
    by_image: dict = {}
    for ann in coco["annotations"]:
        m = mask_utils.decode({**ann["segmentation"], "counts": ann["segmentation"]["counts"].encode()})
        assert m.shape == (48, 48) and int(m.sum()) == ann["area"] > 0
        x, y, w, h = ann["bbox"]
        ys, xs = np.nonzero(m)
        assert math.floor(x) <= xs.min() and xs.max() + 1 <= math.ceil(x + w)
        assert math.floor(y) <= ys.min() and ys.max() + 1 <= math.ceil(y + h)
        by_image.setdefault(ann["image_id"], []).append(m)
    for masks in by_image.values():
        assert int(np.sum(masks, axis=0).max()) == 1


class ConstantRng:
    """Draws the grey (value, value, value) for ever."""

    def __init__(self, value):
        self.value = value

    def integers(self, low, high, size):
        return np.full(size, self.value)


@pytest.mark.parametrize("background, grey, expected", [(0, 10, 255), (250, 240, 0)])
def test_no_contrasting_draw_falls_back_to_white_or_black(background, grey, expected):
    """Grey g has luma g / 255: every draw is within 0.25 of the background's, so after 100
    draws the colour is white on a dark background (luma < 0.5) and black on a light one."""
    from pipeline.synthetic import _contrasting_colour

    assert _contrasting_colour(ConstantRng(grey), (background,) * 3) == (expected,) * 3


def test_unknown_shape_is_named():
    from PIL import Image, ImageDraw

    from pipeline.synthetic import _draw_shape

    with pytest.raises(ValueError, match="unknown shape hexagon"):
        _draw_shape(ImageDraw.Draw(Image.new("RGB", (8, 8))), "hexagon", 4, 4, 2, 0.0, (255, 0, 0))


def test_a_shape_that_finds_no_room_is_left_out(monkeypatch):
    """Every placement overlaps (all centres at distance 0): after 30 tries each further shape
    is dropped and the scene keeps the first one."""
    import math
    import types

    from pipeline import synthetic

    crowded = types.SimpleNamespace(**{**vars(math), "hypot": lambda *xy: 0.0})
    monkeypatch.setattr(synthetic, "math", crowded)
    for index in range(3):
        _, boxes, _ = synthetic.detection_scene(0, "train", index, 48)
        assert len(boxes) == 1


def test_bad_synthetic_config_names_the_key(tmp_path):
    from pipeline.synthetic import main

    with pytest.raises(SystemExit, match=r"\[synthetic\] error: .*shapes_per_image"):
        main(["--out", str(tmp_path), "--config", '{"shapes_per_image": 3}'])
    assert not any(tmp_path.iterdir())


# --- the detection scenes' categories (det_shapes, issue 49) -----------------------------------


def test_novel_scene_categories_are_disjoint_from_the_classification_labels(tmp_path):
    """Read both label sets from what the generator writes: the class folders of cls/ and the
    COCO categories of det/. By default (det_shapes: novel) they share no name; with pretraining
    they are one."""
    from pipeline.dag.sections import NOVEL_SHAPES

    def label_sets(root):
        classes = {p.name for p in (root / "cls" / "train").iterdir()}
        coco = json.loads((root / "det" / "instances_train.json").read_text())
        return classes, [c["name"] for c in coco["categories"]]

    generate(tmp_path / "novel", SMALL, progress=False)  # the default
    classes, categories = label_sets(tmp_path / "novel")
    assert len(categories) == len(set(categories)) == 10 and not classes & set(categories)
    assert categories == list(NOVEL_SHAPES)
    generate(tmp_path / "same", replace(SMALL, det_shapes="pretraining"), progress=False)
    classes, categories = label_sets(tmp_path / "same")
    assert set(categories) == classes == set(CLASSES)


def test_novel_scenes_leave_every_classification_image_as_it_was(tmp_path):
    """The key changes det/ only: cls/ is byte-identical, so no linear number can move."""
    from pipeline.dag.sections import NOVEL_SHAPES

    generate(tmp_path / "a", replace(SMALL, det_shapes="pretraining"), progress=False)
    manifest = generate(tmp_path / "b", replace(SMALL, det_shapes="novel"), progress=False)
    a, b = digest(tmp_path / "a"), digest(tmp_path / "b")
    assert {k: v for k, v in a.items() if k.startswith("cls/")} == {k: v for k, v in b.items() if k.startswith("cls/")}
    assert a["det/train/00000.png"] != b["det/train/00000.png"]
    assert manifest["det"]["categories"] == list(NOVEL_SHAPES) and manifest["cls"]["categories"] == list(CLASSES)


def shape_mask(shape, rot, r=40.0):
    from PIL import Image, ImageDraw

    from pipeline.synthetic import _draw_shape

    canvas = Image.new("L", (128, 128))
    _draw_shape(ImageDraw.Draw(canvas), shape, 64, 64, r, rot, 255)
    return np.asarray(canvas) > 0


def closest_iou(a, b):
    """The largest IoU of shape a (unrotated) with shape b at any of 36 rotations and 3 scales."""
    ma = shape_mask(a, 0.0)
    assert ma.sum() > 500  # drawn, and not a sliver
    best = 0.0
    for rot in np.linspace(0, 2 * np.pi, 36, endpoint=False):
        for r in (34.0, 40.0, 46.0):
            mb = shape_mask(b, rot, r)
            best = max(best, (ma & mb).sum() / (ma | mb).sum())
    return best


def test_no_novel_shape_is_a_class_under_rotation_or_scale():
    """The ten classes' closest pair (a disk and a square, IoU 0.82 at the best rotation and
    scale) is a difference the linear probe reads at ~99 %: every novel shape is further than
    that from every class and from every other novel shape."""
    from pipeline.dag.sections import NOVEL_SHAPES

    classes_apart = max(closest_iou(a, b) for a in CLASSES for b in CLASSES if a < b)
    assert 0.7 < classes_apart < 0.9  # the disk and the square (0.82)
    for shape in NOVEL_SHAPES:
        assert max(closest_iou(shape, c) for c in CLASSES) < classes_apart, shape
        assert all(closest_iou(shape, other) < classes_apart for other in NOVEL_SHAPES if other > shape), shape


# a value for each key other than SMALL's, to change it by
CHANGED = {
    "seed": 1,
    "image_size": 24,
    "train_per_class": 3,
    "val_per_class": 2,
    "det_train_images": 4,
    "det_val_images": 1,
    "det_image_size": 40,
    "det_shapes": "pretraining",
    "backgrounds": 2,
}


def test_each_part_is_generated_from_its_own_keys_alone(tmp_path):
    """The workflow writes cls/ and det/ in separate jobs compared on SYNTHETIC_PARTS' keys: a key
    outside a part must leave its bytes as they were, one inside must change them, and every key
    belongs to a part."""
    from dataclasses import fields

    from pipeline.dag.sections import SYNTHETIC_PARTS

    assert set(CHANGED) == {f.name for f in fields(Synthetic)} == set().union(*SYNTHETIC_PARTS.values())
    generate(tmp_path / "base", SMALL, progress=False)
    base = digest(tmp_path / "base")
    for key, value in CHANGED.items():
        changed = replace(SMALL, **{key: value})
        for part, keys in SYNTHETIC_PARTS.items():
            generate(tmp_path / key, changed, progress=False, parts=(part,))
            after = digest(tmp_path / key / part)
            before = {k.removeprefix(f"{part}/"): v for k, v in base.items() if k.startswith(f"{part}/")}
            images = {k: v for k, v in after.items() if k != "manifest.json"}
            assert (images != {k: v for k, v in before.items() if k != "manifest.json"}) == (key in keys), (key, part)


def test_the_command_line_writes_the_parts_it_is_given(tmp_path):
    from pipeline.synthetic import main

    config = json.dumps({"train_per_class": 1, "val_per_class": 1, "det_train_images": 1, "det_val_images": 1})
    main(["--out", str(tmp_path), "--config", config, "--part", "det"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["det"]
    manifest = json.loads((tmp_path / "det" / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 1, "val": 1} and "image_size" not in manifest["config"]
    main(["--out", str(tmp_path), "--config", config])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cls", "det"]


def test_the_category_sheet_shows_both_label_sets(tmp_path):
    """Two rows of ten tiles, each tile one shape on the dark gradient: its brightest pixels are
    the shape's, and no two tiles of a row are the same picture."""
    from PIL import Image

    from pipeline.synthetic import main

    main(["--sheet", str(tmp_path / "sheet.png")])
    sheet = np.asarray(Image.open(tmp_path / "sheet.png"), float)
    assert sheet.shape == (2 * 96, 10 * 96, 3)
    tiles = [sheet[y : y + 96, x : x + 96] for y in (0, 96) for x in range(0, 960, 96)]
    assert all(np.abs(t - t[:4, :4].mean((0, 1))).max() > 60 for t in tiles)  # a shape on each
    assert len({t.tobytes() for t in tiles}) == 20
    with pytest.raises(SystemExit):
        main([])  # neither --out nor --sheet
