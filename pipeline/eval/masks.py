"""Instance masks in COCO's formats: compressed RLE (what the embedded scenes and the detector's
predictions are written as) and polygons (what COCO's own annotations mostly hold)."""

from __future__ import annotations

import numpy as np
from pycocotools import mask as mask_utils


def to_rle(mask: np.ndarray) -> dict:
    """A bool HxW mask as COCO's compressed RLE, JSON-ready (counts as text)."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def decode(segmentation, height: int, width: int) -> np.ndarray:
    """A COCO ``segmentation`` (polygons, uncompressed or compressed RLE) as a uint8 HxW mask."""
    if isinstance(segmentation, list):  # polygons: their union
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation.get("counts"), list):  # uncompressed RLE (COCO's crowds)
        rle = mask_utils.frPyObjects(segmentation, height, width)
    else:
        counts = segmentation["counts"]
        rle = {"size": segmentation["size"], "counts": counts.encode() if isinstance(counts, str) else counts}
    return mask_utils.decode(rle)
