"""FFCV round trip: what was written is what is read, every sample once per epoch."""
import json

import numpy as np
import torch

from pipeline.convert import scan_imagefolder, load_rgb
from pipeline.data import eval_loader, two_view_loader


def test_round_trip_labels_indices_pixels(synthetic_small, ffcv_small):
    samples, classes = scan_imagefolder(synthetic_small / "cls" / "train")
    images, labels, indices = [], [], []
    for x, y, i in eval_loader(ffcv_small / "train.beton", batch_size=16, crop_size=32, workers=1):
        images.append(x.clone()), labels.append(y.clone()), indices.append(i.clone())
    images, labels, indices = torch.cat(images), torch.cat(labels), torch.cat(indices)
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
    assert indices.tolist() == list(range(len(samples)))
    assert labels.tolist() == [label for _, label in samples]
    # raw write mode, 32 px images at 32 px crop: pixels come back exactly.
    for k in (0, len(samples) // 2, len(samples) - 1):
        expect = torch.from_numpy(load_rgb(samples[k][0])).permute(2, 0, 1)
        assert torch.equal(images[k], expect)
    report = json.loads((ffcv_small / "train.json").read_text())
    assert report["num_samples"] == len(samples) and report["classes"] == classes


def test_two_views_every_sample_once(ffcv_small):
    loader = two_view_loader(ffcv_small / "train.beton", batch_size=8, crop_size=24, workers=1,
                             drop_last=False)
    seen = []
    for v1, v2, y, idx in loader:
        assert v1.shape == v2.shape and v1.shape[1:] == (3, 24, 24)
        assert not torch.equal(v1, v2)  # independent random crops
        seen += idx.tolist()
    assert sorted(seen) == list(range(80))
    assert len(set(seen)) == len(seen)
