import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, why: str) -> None:
    """Skip outside CI when a prerequisite is missing; in CI a missing prerequisite fails."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def synthetic_small(tmp_path_factory) -> Path:
    """A small embedded dataset (ImageFolder + COCO detection scenes), generated once."""
    from pipeline.spec.sections import Synthetic
    from pipeline.synthetic import run as generate

    out = tmp_path_factory.mktemp("synthetic")
    small = Synthetic(train_per_class=8, val_per_class=4, det_train_images=6, det_val_images=4, det_image_size=64)
    generate(out, small, progress=False)
    return out


@pytest.fixture(scope="session")
def ffcv_small(synthetic_small, tmp_path_factory) -> Path:
    """train/val .beton of the small dataset."""
    from pipeline.convert import run as convert
    from pipeline.spec.sections import Convert

    out = tmp_path_factory.mktemp("ffcv")
    for split in ("train", "val"):
        convert(
            synthetic_small / "cls" / split,
            out / f"{split}.beton",
            Convert(max_resolution=32, write_mode="raw", workers=1),
        )
    return out


def run(cmd, timeout=600, cwd=REPO, env=None, check=True):
    """Run a command with a hard timeout; on failure show its output."""
    proc = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def snakemake_bin() -> str:
    exe = Path(sys.executable).with_name("snakemake")
    return str(exe) if exe.exists() else shutil.which("snakemake")
