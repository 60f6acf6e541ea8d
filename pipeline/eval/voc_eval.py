"""Pascal VOC's detection metric, the one the MoCo paper's VOC table reports.

Per class, detections are taken in order of decreasing score; each is a true positive when
its best-overlapping ground-truth box of that class and image overlaps it by more than the
IoU threshold and was not matched before, a false positive otherwise (a duplicate, a miss).
A detection whose best match is a *difficult* object counts as neither, and difficult objects
are not in the recall's denominator. AP is the area under the precision/recall curve:

- ``11point`` (VOC2007's devkit): the mean over recall 0, 0.1, ..., 1 of the highest
  precision at that recall or above;
- ``area`` (VOC2010 and later): the exact area under the curve made monotone.

As Detectron2's VOC evaluator (which produced the paper's numbers), AP50 and AP75 are VOC's
metric at IoU 0.5 and 0.75, and AP is its mean over IoU 0.50, 0.55, ..., 0.95 (COCO's
thresholds); classes without a (non-difficult) ground-truth object are left out of the means.
Boxes are continuous [x0, y0, x1, y1] (pipeline.data.detection turns VOC's 1-based inclusive
pixels into these), so widths need no VOC "+1".
"""

from __future__ import annotations

import numpy as np

IOU_THRESHOLDS = [t / 100 for t in range(50, 100, 5)]  # as Detectron2: exact hundredths
METRICS = ("11point", "area")


def average_precision(recall: np.ndarray, precision: np.ndarray, metric: str = "11point") -> float:
    """AP of one class from its cumulative recall and precision (in detection order)."""
    if metric == "11point":
        points = [precision[recall >= t].max(initial=0.0) for t in np.linspace(0, 1, 11)]
        return float(np.mean(points))
    if metric != "area":
        raise ValueError(f"VOC metric must be one of {METRICS}, not {metric!r}")
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]  # the precision envelope, right to left
    step = np.flatnonzero(r[1:] != r[:-1])  # where recall changes
    return float(np.sum((r[step + 1] - r[step]) * p[step + 1]))


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one [x0, y0, x1, y1] box with each row of ``boxes``."""
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    union = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter
    return inter / np.maximum(union, np.finfo(float).tiny)


def precision_recall(truth: dict, detections: list, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (recall, precision) of one class. truth: {image: (boxes N x 4, difficult N)};
    detections: [(image, score, box)]."""
    positives = sum(int((~difficult).sum()) for _, difficult in truth.values())
    matched = {image: np.zeros(len(boxes), bool) for image, (boxes, _) in truth.items()}
    order = sorted(range(len(detections)), key=lambda i: -detections[i][1])  # stable on ties
    tp, fp = np.zeros(len(order)), np.zeros(len(order))
    for rank, i in enumerate(order):
        image, _, box = detections[i]
        boxes, difficult = truth.get(image, (np.zeros((0, 4)), np.zeros(0, bool)))
        overlaps = iou(np.asarray(box, float), boxes) if len(boxes) else np.zeros(0)
        best = int(overlaps.argmax()) if len(overlaps) else -1
        if best < 0 or overlaps[best] <= threshold:
            fp[rank] = 1
        elif difficult[best]:
            continue  # neither: VOC does not count detections of difficult objects
        elif not matched[image][best]:
            tp[rank], matched[image][best] = 1, True
        else:
            fp[rank] = 1  # a duplicate of a found object
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    recall = tp / positives if positives else np.zeros_like(tp)
    precision = tp / np.maximum(tp + fp, np.finfo(float).eps)
    return recall, precision


def evaluate(gt: dict, detections: list[dict], metric: str = "11point") -> dict:
    """VOC AP of COCO-format ground truth (``difficult`` flags; boxes xywh) and detections
    (COCO results: image_id, category_id, bbox xywh, score). Percentages, as COCO's."""
    truth: dict = {c["id"]: {} for c in gt["categories"]}
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        boxes, difficult = truth[a["category_id"]].setdefault(a["image_id"], ([], []))
        boxes.append([x, y, x + w, y + h])
        difficult.append(bool(a.get("difficult", 0)))
    truth = {
        c: {img: (np.array(b, float).reshape(-1, 4), np.array(d, bool)) for img, (b, d) in per.items()}
        for c, per in truth.items()
    }
    dets: dict[int, list] = {c: [] for c in truth}
    for d in detections:
        x, y, w, h = d["bbox"]
        dets.setdefault(d["category_id"], []).append((d["image_id"], d["score"], (x, y, x + w, y + h)))
    names = {c["id"]: c["name"] for c in gt["categories"]}
    scored = [c for c in truth if any((~diff).any() for _, diff in truth[c].values())]
    per_threshold = {}
    per_class_ap50 = {}
    for t in IOU_THRESHOLDS:
        aps = {c: average_precision(*precision_recall(truth[c], dets[c], t), metric) for c in scored}
        per_threshold[t] = float(np.mean(list(aps.values()))) if aps else 0.0
        if t == 0.5:
            per_class_ap50 = {names[c]: round(100 * ap, 3) for c, ap in aps.items()}
    return {
        "AP": round(100 * float(np.mean(list(per_threshold.values()))), 3),
        "AP50": round(100 * per_threshold[0.5], 3),
        "AP75": round(100 * per_threshold[0.75], 3),
        "metric": metric,
        "per_class_AP50": per_class_ap50,
        "classes_scored": len(scored),
        "classes": len(truth),
    }
