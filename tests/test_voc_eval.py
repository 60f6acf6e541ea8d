"""VOC's detection metric against cases worked out by hand."""

import numpy as np
import pytest

from pipeline.eval import voc_eval


def box(x0, y0, x1, y1):
    return [x0, y0, x1 - x0, y1 - y0]  # COCO xywh


# One class. Image 1: an object A and a difficult object B; image 2: an object C.
GT = {
    "categories": [{"id": 1, "name": "cat"}],
    "images": [{"id": 1}, {"id": 2}],
    "annotations": [
        {"image_id": 1, "category_id": 1, "bbox": box(0, 0, 10, 10)},
        {"image_id": 1, "category_id": 1, "bbox": box(20, 20, 30, 30), "difficult": 1},
        {"image_id": 2, "category_id": 1, "bbox": box(0, 0, 10, 10)},
    ],
}
DETS = [
    {"image_id": 1, "category_id": 1, "bbox": box(0, 0, 10, 10), "score": 0.9},  # A: true positive
    {"image_id": 1, "category_id": 1, "bbox": box(0, 0, 10, 10), "score": 0.8},  # A again: duplicate, FP
    {"image_id": 1, "category_id": 1, "bbox": box(20, 20, 30, 30), "score": 0.7},  # B: difficult, neither
    {"image_id": 2, "category_id": 1, "bbox": box(50, 50, 60, 60), "score": 0.6},  # nothing there: FP
    {"image_id": 2, "category_id": 1, "bbox": box(0, 0, 10, 7.8), "score": 0.5},
]  # C at IoU 0.78


def test_precision_recall_by_hand():
    # 2 positives (B is difficult). In score order: TP, FP, (ignored), FP, TP (IoU 0.78 > 0.5)
    truth = {
        1: (np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([False, True])),
        2: (np.array([[0, 0, 10, 10]], float), np.array([False])),
    }
    dets = [
        (
            d["image_id"],
            d["score"],
            (d["bbox"][0], d["bbox"][1], d["bbox"][0] + d["bbox"][2], d["bbox"][1] + d["bbox"][3]),
        )
        for d in DETS
    ]
    recall, precision = voc_eval.precision_recall(truth, dets, 0.5)
    assert recall.tolist() == [0.5, 0.5, 0.5, 0.5, 1.0]
    assert precision == pytest.approx([1, 1 / 2, 1 / 2, 1 / 3, 1 / 2])
    # at IoU 0.8 the last detection misses C: a false positive
    recall, precision = voc_eval.precision_recall(truth, dets, 0.8)
    assert recall.tolist() == [0.5] * 5 and precision == pytest.approx([1, 1 / 2, 1 / 2, 1 / 3, 1 / 4])


def test_eleven_point_and_area_by_hand():
    r, p = np.array([0.5, 0.5, 0.5, 0.5, 1.0]), np.array([1, 1 / 2, 1 / 2, 1 / 3, 1 / 2])
    # recall 0..0.5 (6 points): best precision 1; recall 0.6..1 (5 points): 1/2
    assert voc_eval.average_precision(r, p, "11point") == pytest.approx((6 * 1 + 5 * 0.5) / 11)
    # area: recall 0 -> 0.5 at precision 1, 0.5 -> 1 at precision 1/2
    assert voc_eval.average_precision(r, p, "area") == pytest.approx(0.5 * 1 + 0.5 * 0.5)
    with pytest.raises(ValueError, match="11point"):
        voc_eval.average_precision(r, p, "101point")


def test_evaluate_by_hand():
    m = voc_eval.evaluate(GT, DETS, "11point")
    found, missed = (6 + 2.5) / 11, 6 / 11  # C found up to IoU 0.75 (6 thresholds), missed from 0.8 (4)
    assert m["AP50"] == pytest.approx(100 * found, abs=1e-3)
    assert m["AP75"] == pytest.approx(100 * found, abs=1e-3)
    assert m["AP"] == pytest.approx(100 * (6 * found + 4 * missed) / 10, abs=1e-3)
    assert m["per_class_AP50"] == {"cat": pytest.approx(100 * found, abs=1e-3)}
    assert voc_eval.evaluate(GT, DETS, "area")["AP50"] == pytest.approx(75.0)


def test_difficult_objects_are_neither_found_nor_missed():
    easy = [d for d in DETS if d["score"] in (0.9,)] + [
        {"image_id": 2, "category_id": 1, "bbox": box(0, 0, 10, 10), "score": 0.95}
    ]
    assert voc_eval.evaluate(GT, easy)["AP"] == pytest.approx(100.0)  # B never needed
    with_b = easy + [{"image_id": 1, "category_id": 1, "bbox": box(20, 20, 30, 30), "score": 0.99}]
    assert voc_eval.evaluate(GT, with_b)["AP"] == pytest.approx(100.0)  # nor a false positive


def test_classes_without_objects_are_left_out_and_missed_classes_score_zero():
    gt = {
        **GT,
        "categories": GT["categories"] + [{"id": 2, "name": "dog"}, {"id": 3, "name": "cow"}],
        "annotations": GT["annotations"] + [{"image_id": 2, "category_id": 2, "bbox": box(5, 5, 9, 9)}],
    }
    perfect_cat = [{"image_id": i, "category_id": 1, "bbox": box(0, 0, 10, 10), "score": 1.0} for i in (1, 2)]
    m = voc_eval.evaluate(gt, perfect_cat)
    assert (m["classes_scored"], m["classes"]) == (2, 3)  # cow has no object
    assert m["per_class_AP50"] == {"cat": 100.0, "dog": 0.0} and m["AP50"] == pytest.approx(50.0)
