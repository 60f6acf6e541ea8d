"""Which files of a folder dataset are its images: the one set of rules that conversion
(pipeline.data.sources) and the DAG's count of the training set (pipeline.dag.training_set)
both apply, so that the epochs planned before conversion are those of the images it converts.

- an image is a visible file whose name ends in one of IMAGE_SUFFIXES;
- hidden files and folders (a leading dot) are left out;
- linked folders are followed, but every real folder and file is taken once (by device and inode);
- an ``imagefolder`` split's images are those under its visible subfolders (its classes).

Standard library only: Snakemake counts with it while it builds the DAG.
"""

from __future__ import annotations

import os
from pathlib import Path

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".webp", ".tif", ".tiff", ".gif"}


class FolderWalk:
    """The images under the folders it is given, in a stable order; with ``limit``, the walk
    stops at the end of the folder in which the images taken reach it.

    Symlinked folders are followed (datasets are often linked from fast storage) but every
    real folder is entered once, so a link back to an ancestor (``loop -> .``) or a second link
    to a folder adds nothing; a file reached a second time (through such a link, or a second
    link to one file) is listed in ``duplicates`` instead of being taken again. Hidden files and
    folders, and files whose names are not images', are listed in ``ignored``.
    """

    def __init__(self, limit: int | None = None):
        self.limit = limit  # stop after the folder in which this many are taken (None: never)
        self.taken = 0
        self.folders: dict[tuple[int, int], str] = {}
        self.files: dict[tuple[int, int], str] = {}
        self.ignored: list[dict] = []
        self.duplicates: list[dict] = []

    @property
    def full(self) -> bool:
        return self.limit is not None and self.taken >= self.limit

    def first_visit(self, path: str, seen: dict, kind: str) -> bool:
        try:
            st = os.stat(path)
        except OSError as err:
            self.ignored.append({"path": path, "reason": f"cannot read ({err.strerror}; a broken link?)"})
            return False
        key = (st.st_dev, st.st_ino)
        if key in seen:
            self.duplicates.append({"path": path, "same_as": seen[key], "kind": kind})
            return False
        seen[key] = path
        return True

    def images(self, folder: Path) -> list[Path]:
        """The images under ``folder`` not taken before."""
        out: list[Path] = []
        if self.full or not self.first_visit(str(folder), self.folders, "folder"):
            return out
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
            kept = []
            for d in sorted(dirnames):
                path = os.path.join(dirpath, d)
                if d.startswith("."):
                    self.ignored.append({"path": path, "reason": "hidden folder (not scanned)"})
                elif self.first_visit(path, self.folders, "folder"):
                    kept.append(d)
            dirnames[:] = kept
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                if f.startswith("."):
                    self.ignored.append({"path": path, "reason": "hidden file"})
                elif self.first_visit(path, self.files, "file"):
                    self._take(Path(path), out)
            if self.full:
                break
        return out

    def _take(self, path: Path, out: list[Path]) -> None:
        if path.suffix.lower() in IMAGE_SUFFIXES:
            out.append(path)
            self.taken += 1
        else:
            self.ignored.append({"path": str(path), "reason": f"not an image file name (suffix '{path.suffix}')"})


def split_images(root: Path, kind: str, walk: FolderWalk) -> dict[str, list[Path]]:
    """The images of the split folder ``root`` by class: an ``imagefolder``'s classes are its
    visible subfolders, sorted by name (files beside them are ignored); an ``unlabeled`` split
    has one entry, ``""``, with the images at any depth."""
    if kind != "imagefolder":
        return {"": walk.images(root)}
    walk.first_visit(str(root), walk.folders, "folder")  # a link back to the split is a loop too
    entries = sorted(root.iterdir())
    walk.ignored += [
        {"path": str(p), "reason": "file outside the class folders"}
        for p in entries
        if p.is_file() and not p.name.startswith(".")
    ]
    return {p.name: walk.images(p) for p in entries if p.is_dir() and not p.name.startswith(".")}


def count_images(root: Path, kind: str, limit: int | None = None) -> int | None:
    """How many images conversion will read from the split folder ``root``; with ``limit``, at
    least ``limit`` where there are as many (the count stops at the end of the folder that
    reaches it: an ImageNet folder after a few thousand files); None when ``root`` is not a
    folder."""
    if not root.is_dir():
        return None
    walk = FolderWalk(limit)
    split_images(root, kind, walk)
    return walk.taken
