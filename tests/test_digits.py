"""studies/digits.py: the held-out real images (scikit-learn's handwritten digits) exported as an
imagefolder the workflow reads."""

import numpy as np
import pytest
from PIL import Image

from pipeline.data.sources import scan_imagefolder
from studies import digits


def test_the_digits_export_writes_an_imagefolder_the_workflow_reads(tmp_path, monkeypatch):
    """The held-out real-image check's export, on 3 classes of made-up greys (scikit-learn is
    not installed: main says how to get it). Each class of 10 images: round(0.2 x 10) = 2 to val."""
    labels = np.repeat([0, 1, 2], 10)
    images = np.stack([np.full((8, 8), label / 2) for label in labels])
    images[:, 2, 3] = 1.0  # one bright pixel, spread by the bilinear upscale
    counts = digits.export(images, labels, tmp_path)
    assert counts == {"train": 24, "val": 6}
    for split, n in (("train", 8), ("val", 2)):
        assert sorted(p.name for p in (tmp_path / split).iterdir()) == ["0", "1", "2"]
        assert all(len(list((tmp_path / split / c).glob("*.png"))) == n for c in "012")
    first = Image.open(next((tmp_path / "train" / "2").glob("*.png")))
    assert first.size == (32, 32) and first.mode == "RGB"
    assert first.getpixel((0, 31)) == (255, 255, 255)  # class 2: grey 1.0 everywhere
    grey_one = Image.open(next((tmp_path / "train" / "1").glob("*.png")))
    assert grey_one.getpixel((31, 31)) == (128, 128, 128)  # rint(0.5 x 255) = 128
    digits.export(images, labels, tmp_path / "again")  # a seeded split: the same images on every run
    val = {p.name for p in (tmp_path / "val").rglob("*.png")}
    assert val == {p.name for p in (tmp_path / "again" / "val").rglob("*.png")}
    found = scan_imagefolder(tmp_path / "train", "train")
    assert len(found.items) == 24 and list(found.classes) == ["0", "1", "2"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="pip install scikit-learn"):
        digits.main(["--out", str(tmp_path / "real")])
