"""Detection datasets, all read into COCO-format dicts (images, annotations, categories):

- ``coco``: a folder with ``instances_{train,val}.json`` and the images their ``file_name``s
  name (the embedded scenes), or the COCO 2017 layout (``annotations/instances_{train,val}2017.json``,
  ``train2017/``, ``val2017/``);
- ``voc``: a ``VOCdevkit`` folder (``VOC2007/``, ``VOC2012/``: ``Annotations/*.xml``,
  ``ImageSets/Main/<set>.txt``, ``JPEGImages/``). By default VOC07+12 trainval is the training
  set and VOC07 test the evaluation set, as in the MoCo paper. Objects marked ``difficult`` are
  kept for training and ignored in evaluation (``iscrowd``: a detection on them counts neither
  as a true nor as a false positive), as in VOC's protocol.

``dataset: auto`` picks the layout from what ``root`` holds.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from pipeline.dag.sections import Voc

VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)


class DetectionDataError(FileNotFoundError):
    """A detection root that is missing, of an unknown layout, or malformed."""


@dataclass
class DetectionSplit:
    coco: dict  # COCO-format: images, annotations, categories
    image_root: Path  # file_name is relative to this folder
    name: str  # what it is, for logs and metrics
    kind: str = "coco"  # coco | voc: the evaluation protocol of its own benchmark
    year: str | None = None  # VOC: the year of its image sets (2007's test set: the 11-point metric)

    @property
    def num_classes(self) -> int:
        """Classes including the background (label 0), as torchvision counts them."""
        return max(c["id"] for c in self.coco["categories"]) + 1


def detect_layout(root: Path) -> str:
    if (root / "instances_train.json").is_file() or (root / "annotations" / "instances_train2017.json").is_file():
        return "coco"
    if (root / "VOC2007").is_dir() or (root / "VOC2012").is_dir():
        return "voc"
    raise DetectionDataError(
        f"{root}: neither a COCO folder (instances_train.json, or "
        "annotations/instances_train2017.json) nor a VOCdevkit (VOC2007/, VOC2012/)"
    )


def load_splits(root, dataset: str = "auto", voc: Voc | None = None) -> tuple[DetectionSplit, DetectionSplit]:
    """(train, val) of the detection dataset under ``root``; ``voc``: detect.voc (None: the
    defaults, VOC07+12 -> VOC07 test)."""
    root = Path(root)
    if not root.is_dir():
        raise DetectionDataError(f"detection dataset root not found: {root}")
    layout = detect_layout(root) if dataset == "auto" else dataset
    if layout == "coco":
        return coco_split(root, "train"), coco_split(root, "val")
    if layout == "voc":
        voc = voc or Voc()
        return voc_split(root, list(voc.train)), voc_split(root, [voc.val])
    raise ValueError(f"detect.dataset must be auto, coco or voc, not {dataset!r}")


# --- COCO ------------------------------------------------------------------------------------
def coco_split(root: Path, split: str) -> DetectionSplit:
    flat = root / f"instances_{split}.json"
    if flat.is_file():
        return DetectionSplit(_read_json(flat), root, str(flat))
    official = root / "annotations" / f"instances_{split}2017.json"
    if official.is_file():
        return DetectionSplit(_read_json(official), root / f"{split}2017", str(official))
    raise DetectionDataError(f"annotation file not found: {flat} (nor {official})")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DetectionDataError(f"{path}: not valid JSON ({err})") from None
    missing = {"images", "annotations", "categories"} - set(data)
    if missing:
        raise DetectionDataError(f"{path}: not a COCO annotation file (no {sorted(missing)})")
    return data


# --- Pascal VOC ------------------------------------------------------------------------------
def voc_split(devkit: Path, sets: list[str]) -> DetectionSplit:
    """COCO dict of the union of VOC image sets such as ["2007/trainval", "2012/trainval"]."""
    categories = [{"id": i + 1, "name": name, "supercategory": "voc"} for i, name in enumerate(VOC_CLASSES)]
    class_id = {c["name"]: c["id"] for c in categories}
    images: list[dict] = []
    annotations: list[dict] = []
    for item in sets:
        year, _, image_set = item.partition("/")
        folder = devkit / f"VOC{year}"
        listing = folder / "ImageSets" / "Main" / f"{image_set}.txt"
        if not listing.is_file():
            raise DetectionDataError(f"VOC image set not found: {listing} (detect.voc names '{item}')")
        for stem in listing.read_text().split():
            image_id = len(images) + 1
            width, height, objects = _voc_annotation(folder / "Annotations" / f"{stem}.xml", class_id)
            images.append(
                {"id": image_id, "file_name": f"VOC{year}/JPEGImages/{stem}.jpg", "width": width, "height": height}
            )
            for label, (x0, y0, x1, y1), difficult in objects:
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": image_id,
                        "category_id": label,
                        "bbox": [x0, y0, x1 - x0, y1 - y0],
                        "area": (x1 - x0) * (y1 - y0),
                        "iscrowd": int(difficult),
                        "difficult": int(difficult),
                    }
                )
    years = {item.partition("/")[0] for item in sets}
    return DetectionSplit(
        {"images": images, "annotations": annotations, "categories": categories},
        devkit,
        "VOC " + "+".join(sets),
        kind="voc",
        year=years.pop() if len(years) == 1 else None,
    )


def write_voc(split: DetectionSplit, devkit: Path, year: str, image_set: str, difficult=frozenset()) -> None:
    """Write a COCO-format split as the VOC image set ``VOC<year>/<image_set>`` of ``devkit``:
    JPEGs, XML annotations (1-based inclusive pixels, as VOC's) and the listing. ``difficult``:
    annotation ids to mark difficult. Class ids map to VOC_CLASSES in order (at most 20)."""
    from PIL import Image

    if max(c["id"] for c in split.coco["categories"]) > len(VOC_CLASSES):
        raise DetectionDataError(f"{split.name}: more than {len(VOC_CLASSES)} classes do not fit VOC's")
    folder = Path(devkit) / f"VOC{year}"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    by_image: dict[int, list] = {}
    for a in split.coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    stems = []
    for img in split.coco["images"]:
        stem = f"{image_set}_{img['id']:06d}"
        Image.open(split.image_root / img["file_name"]).convert("RGB").save(
            folder / "JPEGImages" / f"{stem}.jpg", quality=95
        )
        objects = "".join(
            f"<object><name>{VOC_CLASSES[a['category_id'] - 1]}</name>"
            f"<difficult>{int(a['id'] in difficult)}</difficult><bndbox>"
            f"<xmin>{a['bbox'][0] + 1:g}</xmin><ymin>{a['bbox'][1] + 1:g}</ymin>"
            f"<xmax>{a['bbox'][0] + a['bbox'][2]:g}</xmax><ymax>{a['bbox'][1] + a['bbox'][3]:g}</ymax>"
            "</bndbox></object>"
            for a in by_image.get(img["id"], [])
        )
        (folder / "Annotations" / f"{stem}.xml").write_text(
            f"<annotation><size><width>{img['width']}</width><height>{img['height']}</height><depth>3</depth>"
            f"</size>{objects}</annotation>"
        )
        stems.append(stem)
    (folder / "ImageSets" / "Main" / f"{image_set}.txt").write_text("\n".join(stems) + "\n")


def to_voc(coco_root: Path, devkit: Path) -> None:
    """A COCO-layout folder (the embedded scenes) as a VOCdevkit: train -> VOC2007 trainval,
    val -> VOC2007 test, so detection runs and is scored by VOC's protocol on it."""
    train, val = coco_split(Path(coco_root), "train"), coco_split(Path(coco_root), "val")
    write_voc(train, devkit, "2007", "trainval")
    write_voc(val, devkit, "2007", "test")


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(
        description="Write a COCO-layout detection folder (e.g. the embedded scenes) "
        "as a VOCdevkit: train -> VOC2007 trainval, val -> VOC2007 test"
    )
    ap.add_argument("--coco", required=True, help="folder with instances_{train,val}.json and the images")
    ap.add_argument("--out", required=True, help="the VOCdevkit folder to write")
    args = ap.parse_args(argv)
    try:
        to_voc(Path(args.coco), Path(args.out))
    except DetectionDataError as err:
        raise SystemExit(f"[detection_data] error: {err}") from None
    print(f"[detection_data] {args.coco} -> {args.out} (VOC2007 trainval / test)")


def _text(node: ET.Element | None, key: str) -> str:
    """The text of ``node``'s child ``key``; a missing one makes the file malformed (ValueError)."""
    text = None if node is None else node.findtext(key)
    if text is None:
        raise ValueError(f"no <{key}>")
    return text


def _voc_annotation(path: Path, class_id: dict) -> tuple[int, int, list]:
    if not path.is_file():
        raise DetectionDataError(f"VOC annotation not found: {path}")
    try:
        tree = ET.parse(path).getroot()
        size = tree.find("size")
        width, height = int(_text(size, "width")), int(_text(size, "height"))
        objects = []
        for obj in tree.iter("object"):
            name = _text(obj, "name").strip()
            if name not in class_id:
                raise DetectionDataError(f"{path}: unknown VOC class {name!r}")
            box = obj.find("bndbox")
            # VOC pixel indices are 1-based and inclusive: [xmin - 1, xmax] in 0-based continuous coordinates
            x0, y0, x1, y1 = (float(_text(box, k)) for k in ("xmin", "ymin", "xmax", "ymax"))
            objects.append((class_id[name], (x0 - 1, y0 - 1, x1, y1), obj.findtext("difficult", "0").strip() == "1"))
    except (ET.ParseError, AttributeError, TypeError, ValueError) as err:
        raise DetectionDataError(f"{path}: malformed VOC annotation ({type(err).__name__}: {err})") from None
    return width, height, objects


if __name__ == "__main__":
    main()
