"""Atomic file writes: a killed job never leaves a file that looks complete."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(obj, path: str | Path) -> None:
    atomic_write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", path)


def atomic_save_png(image, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")


def atomic_torch_save(obj, path: str | Path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
