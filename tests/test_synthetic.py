"""The embedded dataset is deterministic: the same seed gives byte-identical files."""

import hashlib
import json
from dataclasses import replace

from pipeline.spec.sections import Synthetic
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
    assert da == db and len(da) == 10 * 3 + 5 + 3  # images + 2 COCO files + manifest


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
