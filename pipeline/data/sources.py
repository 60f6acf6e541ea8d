"""Where the images of a split come from: one scanner per dataset layout.

The FFCV conversion and the torchvision loader both read sources through this module, so both
see the same samples in the same order with the same labels: sample index ``i`` is the i-th
item of the scan that survived the conversion's checks (the report lists the skipped ones).

Kinds (``dataset.source``; the embedded ``synthetic`` dataset is an ``imagefolder``):

- ``imagefolder``: ``root/<class>/**/<image>`` (ImageNet layout); classes sorted by name.
- ``unlabeled``: ``root/**/<image>``, every label -1 (pretraining-only data).
- ``cifar10`` / ``cifar100``: torchvision's on-disk copy under ``root`` (python pickles).
- ``stl10``: torchvision's ``root/stl10_binary``; splits ``train`` (5k labelled), ``test``,
  ``unlabeled`` (100k, label -1) and ``train+unlabeled``.

For the file kinds ``root`` is the folder of the split itself; for the array kinds it is the
torchvision root and ``split`` picks the files (``val`` means the test set).
"""

from __future__ import annotations

import abc
import copy
import hashlib
import io
import math
import os
import pickle
from pathlib import Path

import numpy as np

from pipeline.base.folders import FolderWalk, split_images
from pipeline.runtime import lean_torchvision

FILE_KINDS = ("imagefolder", "unlabeled")
ARRAY_KINDS = ("cifar10", "cifar100", "stl10")
KINDS = FILE_KINDS + ARRAY_KINDS
UNLABELED = -1


class SourceError(RuntimeError):
    """The dataset cannot be read as configured; the message says what is wrong and where."""


class Source(abc.ABC):
    """The items of one split, their labels, and how to decode an item to HxWx3 uint8 RGB."""

    verified = False  # True where items cannot be corrupt (decoded arrays): no check pass needed

    def __init__(self, kind: str, root: Path, split: str, classes: list[str], items: list, labels: list[int]):
        self.kind, self.root, self.split = kind, root, split
        self.classes, self.items, self.labels = classes, items, labels
        self.ignored: list[dict] = []  # files seen but not taken as images, and why
        self.duplicates: list[dict] = []  # files or folders reached twice by the scan, taken once
        self.notes: list[str] = []

    def __len__(self) -> int:
        return len(self.items)

    def key(self, i: int) -> str:
        """How the report names item i (a file path, or kind:split[position])."""
        return str(self.items[i])

    @abc.abstractmethod
    def load(self, i: int, max_side: int | None = None) -> np.ndarray:
        """Item i as HxWx3 uint8 RGB (a JPEG file may be decoded at a reduced scale that
        keeps its longest side >= ``max_side``)."""

    @abc.abstractmethod
    def probe(self, i: int, max_side: int | None = None) -> tuple[tuple[int, int], str | None]:
        """Decode item i as the writer will (raising if it cannot): its (h, w) as displayed
        (EXIF orientation applied) and a digest of its content (None where not computed)."""

    def select(self, keep: list[int]) -> Source:
        """The same source restricted to the items at positions ``keep`` (in that order)."""
        out = copy.copy(self)
        out.items = [self.items[i] for i in keep]
        out.labels = [self.labels[i] for i in keep]
        return out

    def digest(self) -> str:
        """A fingerprint of the items in order: a loader rescanning the source checks it."""
        h = hashlib.sha1()
        for i in range(len(self)):
            h.update(self.key(i).encode() + b"\n")
        return h.hexdigest()

    def describe(self) -> dict:
        """What the report records so that a loader can reopen exactly this source."""
        return {"kind": self.kind, "root": str(self.root), "split": self.split}


class FileSource(Source):
    def load(self, i: int, max_side: int | None = None) -> np.ndarray:
        return decode_file(self.items[i], max_side)

    def probe(self, i: int, max_side: int | None = None) -> tuple[tuple[int, int], str]:
        """Also the SHA-1 of the file's bytes (read once, decoded from memory)."""
        data = Path(self.items[i]).read_bytes()
        size: list = []
        decode_file(io.BytesIO(data), max_side, size)
        return size[0], hashlib.sha1(data).hexdigest()


class ArraySource(Source):
    """Images already decoded in memory (CIFAR, STL-10); items are positions in ``data``."""

    verified = True

    def __init__(self, *args, data: np.ndarray, **kwargs):
        super().__init__(*args, **kwargs)
        self.data = data  # N x H x W x 3 uint8 (possibly a strided view)

    def key(self, i: int) -> str:
        return f"{self.kind}:{self.split}[{self.items[i]}]"

    def load(self, i: int, max_side: int | None = None) -> np.ndarray:
        return np.ascontiguousarray(self.data[self.items[i]])

    def probe(self, i: int, max_side: int | None = None) -> tuple[tuple[int, int], None]:
        return tuple(self.data.shape[1:3]), None


EXIF_ORIENTATION = 0x0112
TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def decode_file(path, max_side: int | None = None, size_out: list | None = None) -> np.ndarray:
    """Decode an image file fully (a truncated file fails here) to HxWx3 uint8 RGB, as it is
    meant to be seen: EXIF orientation applied (as ``ImageOps.exif_transpose``), the first
    frame of an animation, 16-bit greyscale scaled to 8 bits, alpha dropped (as torchvision's
    loader does). ``path`` may be a file object.

    With ``max_side``, JPEGs are decoded at the smallest libjpeg scale (1/2, 1/4, 1/8) that
    keeps the longest side >= max_side: the result is resized to max_side anyway, and a large
    JPEG then decodes several times faster. ``size_out`` receives the displayed (h, w) at
    full resolution.
    """
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        orientation = im.getexif().get(EXIF_ORIENTATION, 1)
        w, h = im.size
        if size_out is not None:
            size_out.append((w, h) if orientation in TRANSPOSED else (h, w))
        if max_side and im.format == "JPEG":
            s = max_side / max(w, h)
            if s < 0.5:
                im.draft("RGB", (math.ceil(w * s), math.ceil(h * s)))
        im.load()
        if orientation != 1:
            im = ImageOps.exif_transpose(im)  # type: ignore[assignment]  # an Image, as to_rgb takes
        return to_rgb(im)


def to_rgb(im) -> np.ndarray:
    """A writable HxWx3 uint8 copy (torch wants one) of a PIL image of any mode."""
    if im.mode.startswith("I"):  # 16/32-bit greyscale: PIL's convert would clip at 255
        a = np.asarray(im).astype(np.int64)
        if a.min(initial=0) >= 0 and a.max(initial=0) <= 0xFFFF:
            a = a >> 8
        else:  # wider than 16 bits: stretch its range
            a = (a - a.min()) * 255 // max(1, int(np.ptp(a)))
        return np.repeat(a.astype(np.uint8)[:, :, None], 3, axis=2)
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # the direct route warns about byte transparency
    return np.array(im.convert("RGB"))


def _require_dir(root: Path, what: str) -> None:
    if not root.is_dir():
        raise SourceError(f"{what} not found: {root}")


def scan_imagefolder(root: Path, split: str) -> FileSource:
    _require_dir(root, "dataset split folder")
    walk = FolderWalk()
    by_class = split_images(root, "imagefolder", walk)
    if not by_class:
        raise SourceError(f"{root}: no class folders (expected {root}/<class>/<image>)")
    linked = {d["path"]: d["same_as"] for d in walk.duplicates if d["kind"] == "folder"}
    items, labels = [], []
    for label, (name, files) in enumerate(by_class.items()):
        if not files and str(root / name) in linked:
            raise SourceError(
                f"{root / name}: class '{name}' is the folder {linked[str(root / name)]} "
                "again (a symlink); its images would carry two labels"
            )
        if not files:
            raise SourceError(f"{root / name}: class '{name}' has no images (remove the folder or add images)")
        items += files
        labels += [label] * len(files)
    return _file_source("imagefolder", root, split, list(by_class), items, labels, walk)


def scan_unlabeled(root: Path, split: str) -> FileSource:
    _require_dir(root, "dataset split folder")
    walk = FolderWalk()
    files = split_images(root, "unlabeled", walk)[""]
    if not files:
        raise SourceError(f"{root}: no images in the {split} split")
    return _file_source("unlabeled", root, split, [], files, [UNLABELED] * len(files), walk)


def _file_source(kind, root, split, classes, items, labels, walk: FolderWalk) -> FileSource:
    src = FileSource(kind, root, split, classes, items, labels)
    src.ignored, src.duplicates = walk.ignored, walk.duplicates
    return src


def _torchvision_copy(cls, root: Path, kind: str, notes: list[str], **kwargs):
    """torchvision's dataset class on a local copy, never downloading.

    torchvision verifies the MD5 of every file of the official release. A copy that differs
    (a subset, a re-packed or a generated test copy) is still read, with a note in the report;
    a missing folder or file fails with its path.
    """
    folder = root / cls.base_folder
    _require_dir(folder, f"{kind}: torchvision folder (download it with torchvision first; downloads are off here)")
    try:
        return cls(str(root), download=False, **kwargs)
    except RuntimeError as err:
        if "corrupted" not in str(err):
            raise
    notes.append(f"{kind}: files under {folder} differ from the official release (checksums); read anyway")
    try:
        return _unverified(cls)(str(root), download=False, **kwargs)
    except (FileNotFoundError, KeyError, ValueError, pickle.UnpicklingError, EOFError) as err:
        raise SourceError(f"{kind}: cannot read {folder}: {type(err).__name__}: {err}") from None


def _unverified(cls):
    """``cls`` without its checksum checks (only the integrity test and CIFAR's meta loader)."""

    class Unverified(cls):  # type: ignore[misc,valid-type]  # a class made at run time
        def _check_integrity(self) -> bool:
            return True

        def _load_meta(self) -> None:
            with open(os.path.join(self.root, self.base_folder, self.meta["filename"]), "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return Unverified


def scan_cifar(root: Path, split: str, kind: str) -> ArraySource:
    datasets = lean_torchvision.load().datasets  # not torch._dynamo with it (see there)

    if split not in ("train", "val", "test"):
        raise SourceError(f"{kind}: unknown split '{split}' (train, val = test)")
    cls = datasets.CIFAR10 if kind == "cifar10" else datasets.CIFAR100
    notes: list[str] = []
    ds = _torchvision_copy(cls, root, kind, notes, train=split == "train")
    data = np.asarray(ds.data)
    src = ArraySource(
        kind, root, split, list(ds.classes), list(range(len(data))), [int(t) for t in ds.targets], data=data
    )
    src.notes = notes
    return src


STL_SPLITS = {
    "train": "train",
    "val": "test",
    "test": "test",
    "unlabeled": "unlabeled",
    "train+unlabeled": "train+unlabeled",
}


def scan_stl10(root: Path, split: str) -> ArraySource:
    datasets = lean_torchvision.load().datasets  # not torch._dynamo with it (see there)

    if split not in STL_SPLITS:
        raise SourceError(f"stl10: unknown split '{split}' ({', '.join(STL_SPLITS)})")
    notes: list[str] = []
    ds = _torchvision_copy(datasets.STL10, root, "stl10", notes, split=STL_SPLITS[split])
    classes = list(getattr(ds, "classes", [])) or [str(i) for i in range(10)]
    data = ds.data.transpose(0, 2, 3, 1)  # N x 3 x H x W (stored column-major) -> N x H x W x 3
    src = ArraySource("stl10", root, split, classes, list(range(len(data))), [int(t) for t in ds.labels], data=data)
    src.notes = notes
    return src


def open_source(kind: str, root, split: str = "train") -> Source:
    """Scan one split; fails with a SourceError naming the folder or file at fault."""
    root = Path(root).expanduser().resolve()
    if kind == "imagefolder":
        return scan_imagefolder(root, split)
    if kind == "unlabeled":
        return scan_unlabeled(root, split)
    if kind in ("cifar10", "cifar100"):
        return scan_cifar(root, split, kind)
    if kind == "stl10":
        return scan_stl10(root, split)
    raise SourceError(f"unknown dataset source kind '{kind}' (one of {', '.join(KINDS)})")
