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
