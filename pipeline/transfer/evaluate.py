"""Scoring a detector on a split: its detections in COCO results format (boxes, and masks as
RLE), scored by pycocotools (box AP, and mask AP for Mask R-CNN) or, on Pascal VOC, by VOC's
own metric with the COCO-style numbers beside it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from pipeline.dag.sections import Detect
from pipeline.data.detection import DetectionSplit
from pipeline.eval import masks as masks_io
from pipeline.eval import voc_eval
from pipeline.runtime import lean_torchvision
from pipeline.transfer import log
from pipeline.transfer.data import CocoBoxes, collate
from pipeline.transfer.metrics import AP_KEYS

lean_torchvision.load()  # before any torchvision import: see there
from torchvision.models.detection import FasterRCNN  # noqa: E402

MASK_THRESHOLD = 0.5  # a predicted mask's pixels: probability above this (torchvision's, Detectron2's)


@torch.no_grad()
def predict(detector: FasterRCNN, dataset: CocoBoxes, batch_size: int) -> list[dict]:
    """Detections on a dataset, in COCO results format (boxes in original image pixels; a
    Mask R-CNN's also with its ``segmentation``, RLE)."""
    detector.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    device, results = next(detector.parameters()).device, []
    for images, targets in loader:
        for out, target in zip(detector([im.to(device) for im in images]), targets):
            for k, ((x0, y0, x1, y1), label, score) in enumerate(
                zip(out["boxes"].tolist(), out["labels"].tolist(), out["scores"].tolist())
            ):
                result = {
                    "image_id": target["image_id"],
                    "category_id": label,
                    "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                    "score": round(score, 5),
                }
                if "masks" in out:  # N x 1 x H x W probabilities, pasted into the image
                    result["segmentation"] = masks_io.to_rle((out["masks"][k, 0] > MASK_THRESHOLD).cpu().numpy())
                results.append(result)
    return results


def coco_from_dict(data: dict) -> COCO:
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress chatter
        coco.createIndex()
    return coco


def coco_evaluate(gt: dict | str | Path, detections: list[dict], iou_type: str = "bbox") -> dict:
    """COCO AP, AP50, AP75, APs, APm, APl in percent (None: no ground truth of that size), of
    the boxes (``iou_type`` bbox) or of the masks (segm: IoU of the masks, each detection's
    ``segmentation``). ``gt``: a COCO-format dict or its JSON file. Ground truth marked iscrowd
    (crowds; VOC's difficult objects) is ignored, not missed."""
    if not isinstance(gt, dict):
        if not Path(gt).is_file():
            raise FileNotFoundError(f"annotation file not found: {gt}")
        gt = json.loads(Path(gt).read_text())
    assert isinstance(gt, dict)  # for the checker: a dict, read or given
    coco_gt = coco_from_dict(gt)
    if iou_type == "segm":  # without a box pycocotools reads a result's area and box from its mask
        detections = [{k: v for k, v in d.items() if k != "bbox"} for d in detections]
    with contextlib.redirect_stdout(io.StringIO()):
        # loadRes rejects an empty list: evaluate against an empty result set instead
        coco_dt = (
            coco_gt.loadRes(detections)
            if detections
            else coco_from_dict({"images": gt["images"], "annotations": [], "categories": gt["categories"]})
        )
        evaluator = COCOeval(coco_gt, coco_dt, iouType=iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    metrics = {k: round(100 * float(v), 3) if v >= 0 else None for k, v in zip(AP_KEYS, evaluator.stats)}
    log(f"COCO {iou_type} " + " ".join(f"{k}={v}" for k, v in metrics.items()) + f" ({len(detections)} detections)")
    return metrics


def voc_metric(split: DetectionSplit, dc: Detect) -> str:
    """auto: VOC2007's 11-point metric on a 2007 test set, the area under the curve otherwise
    (as Detectron2 picks it by the test set's year)."""
    choice = dc.voc_metric
    return choice if choice != "auto" else ("11point" if split.year == "2007" else "area")


def evaluate(split: DetectionSplit, detections: list[dict], dc: Detect) -> dict:
    """The split's own protocol: COCO box AP; on VOC, VOC's metric (AP50, AP75 and AP over IoU
    0.50:0.95, as the MoCo paper's VOC table) with the COCO-style numbers beside it."""
    coco = coco_evaluate(split.coco, detections)
    if dc.task == "segmentation":  # check_masks: not VOC
        segm = coco_evaluate(split.coco, detections, "segm")
        return {**coco, **{f"mask_{k}": v for k, v in segm.items()}, "protocol": "COCO box and mask AP (pycocotools)"}
    if split.kind != "voc":
        return {**coco, "protocol": "COCO box AP (pycocotools)"}
    metric = voc_metric(split, dc)
    voc = voc_eval.evaluate(split.coco, detections, metric)
    log(f"VOC ({metric}) AP50={voc['AP50']} AP={voc['AP']} AP75={voc['AP75']}")
    return {
        "AP": voc["AP"],
        "AP50": voc["AP50"],
        "AP75": voc["AP75"],
        "APs": None,
        "APm": None,
        "APl": None,
        "protocol": f"VOC {metric} AP (AP over IoU 0.50:0.95, as Detectron2's VOC evaluator)",
        "per_class_AP50": voc["per_class_AP50"],
        "coco_style": coco,
    }
