"""pipeline.data.detection: the detection datasets (COCO and VOC): a bad kind, a malformed or missing
annotation file, too many classes for VOC and the to-VOC command line name what is wrong."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

from pipeline.data.detection import DetectionDataError, DetectionSplit, coco_split, load_splits, voc_split, write_voc


def test_unknown_dataset_kind_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"auto, coco or voc, not 'yolo'"):
        load_splits(tmp_path, "yolo")


def test_malformed_coco_json_names_the_file(tmp_path):
    path = tmp_path / "instances_train.json"
    path.write_text("{not json")
    with pytest.raises(DetectionDataError, match=r"instances_train\.json: not valid JSON"):
        coco_split(tmp_path, "train")
    path.write_text(json.dumps({"images": []}))
    with pytest.raises(DetectionDataError, match=r"not a COCO annotation file \(no \['annotations', 'categories'\]\)"):
        coco_split(tmp_path, "train")


def test_voc_annotation_missing_or_without_a_size_names_the_xml(tmp_path):
    listing = tmp_path / "VOC2007" / "ImageSets" / "Main" / "test.txt"
    listing.parent.mkdir(parents=True)
    listing.write_text("000001\n")
    with pytest.raises(DetectionDataError, match=r"VOC annotation not found: .*VOC2007/Annotations/000001\.xml"):
        voc_split(tmp_path, ["2007/test"])
    xml = tmp_path / "VOC2007" / "Annotations" / "000001.xml"
    xml.parent.mkdir()
    xml.write_text("<annotation><size><width>4</width></size></annotation>")
    with pytest.raises(DetectionDataError, match=r"000001\.xml: malformed VOC annotation \(ValueError: no <height>\)"):
        voc_split(tmp_path, ["2007/test"])


def test_more_classes_than_voc_has_are_refused(tmp_path):
    split = DetectionSplit({"images": [], "annotations": [], "categories": [{"id": 21}]}, tmp_path, "scenes")
    with pytest.raises(DetectionDataError, match=r"scenes: more than 20 classes do not fit VOC's"):
        write_voc(split, tmp_path / "devkit", "2007", "test")
    assert not (tmp_path / "devkit").exists()


def test_to_voc_cli_exits_with_the_missing_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.data.detection", "--coco", str(tmp_path / "no"), "--out", str(tmp_path / "v")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "[detection_data] error: annotation file not found:" in proc.stderr
    assert "instances_train.json" in proc.stderr
