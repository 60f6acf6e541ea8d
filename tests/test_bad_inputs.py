"""Odd dataset trees a user points the converter at: each converts, or fails with a message
that names the problem, and nothing is written half-way. Every file is generated here."""

import dataclasses
import json
import os
import struct
import subprocess
import warnings
import zlib

import numpy as np
import pytest
import torch
from conftest import require
from PIL import Image
from test_convert import RAW, make_imagefolder, no_temporaries, rand_images, read_beton

from pipeline import convert as conv
from pipeline.convert import ConversionError
from pipeline.convert import run as convert
from pipeline.data.loaders import Reading, Views, two_view_loader
from pipeline.data.sources import SourceError, decode_file, open_source

OPTS = dataclasses.replace(RAW, max_resolution=64)


def stored_by_path(report, out):
    """{source path: stored image} of a converted split."""
    images, _, indices, _ = read_beton(out)
    src = open_source(report["source"]["kind"], report["source"]["root"], report["source"]["split"])
    keep = [i for i in range(len(src)) if str(src.items[i]) not in {s["path"] for s in report["skipped"]}]
    return {str(src.items[keep[idx]]): images[k] for k, idx in enumerate(indices)}


# --- 1. sizes the writer cannot scale -------------------------------------------------------
def test_extreme_aspect_ratio_is_stored_with_every_side_at_least_one_pixel(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root, per_class=3, size=(20, 24))
    banner = rand_images(1, 8, 4000, seed=9)[0]  # 64 px: the short side would round to 0
    Image.fromarray(banner).save(root / "a" / "banner.png")
    large = rand_images(1, 100, 80, seed=3)[0]  # an ordinary image scaled as FFCV would
    Image.fromarray(large).save(root / "b" / "large.png")
    out = tmp_path / "ffcv" / "train.beton"
    report = convert(root, out, OPTS, split="train", progress=False)
    assert report["num_samples"] == 8 and report["skipped"] == []
    stored = stored_by_path(report, out)
    assert stored[str(root / "a" / "banner.png")].shape == (1, 64, 3)
    import cv2

    assert np.array_equal(
        stored[str(root / "b" / "large.png")], cv2.resize(large, (51, 64), interpolation=cv2.INTER_AREA)
    )  # FFCV's own sizes
    assert report["resolution"]["stored"]["min_hw"] == [1, 24]
    # and the training loader crops it like any other image
    seen = []
    for v1, _v2, _, idx in two_view_loader(out, Views(crop_size=16), Reading(batch_size=4, workers=1, drop_last=False)):
        assert v1.shape[1:] == (3, 16, 16) and torch.isfinite(v1.float()).all()
        seen += idx.tolist()
    assert sorted(seen) == list(range(8))


def _png_header_only(width, height):
    """A PNG that declares width x height (a decompression bomb's header) and holds one row."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00" * (3 * width + 1)))
        + chunk(b"IEND", b"")
    )


def test_decompression_bomb_is_skipped_with_its_reason(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root)
    (root / "a" / "bomb.png").write_bytes(_png_header_only(40000, 40000))
    report = convert(root, tmp_path / "train.beton", OPTS, split="train", progress=False)
    assert report["num_samples"] == 6
    (skip,) = report["skipped"]
    assert skip["path"].endswith("bomb.png") and "DecompressionBomb" in skip["reason"]


# --- 2. links: every real folder once, duplicates reported ------------------------------------
def test_symlink_cycle_and_repeated_links_take_each_file_once(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root, per_class=3)
    (root / "a" / "sub").mkdir()
    (root / "a" / "sub" / "notes.txt").write_text("x")
    os.symlink(".", root / "a" / "loop")  # a cycle
    os.symlink("../a", root / "b" / "a_again")  # another class's folder, linked
    os.symlink("../a/0.png", root / "b" / "same_file.png")  # one file, two names
    fast = tmp_path / "fast_storage" / "c"  # a class kept elsewhere, linked in
    make_imagefolder(tmp_path / "fast_storage", classes=("c",), per_class=2)
    os.symlink(fast, root / "c")

    report = convert(root, tmp_path / "train.beton", OPTS, split="train", progress=False)
    assert report["counts_per_class"] == {"a": 3, "b": 3, "c": 2}
    dup = {os.path.relpath(d["path"], root): os.path.relpath(d["same_as"], root) for d in report["duplicates"]}
    assert dup == {"a/loop": "a", "b/a_again": "a", "b/same_file.png": "a/0.png"}
    assert [i["path"] for i in report["ignored"]] == [str(root / "a" / "sub" / "notes.txt")]  # listed once


def test_a_class_folder_linked_to_another_class_fails_clearly(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root, classes=("a",))
    os.symlink("a", root / "b")
    with pytest.raises(ConversionError, match=r"class 'b' is the folder .*/a again \(a symlink\)"):
        convert(root, tmp_path / "train.beton", OPTS, split="train", progress=False)


def test_same_bytes_under_two_labels_are_reported(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root, per_class=3)
    (root / "b" / "copy.png").write_bytes((root / "a" / "1.png").read_bytes())
    (root / "a" / "copy.png").write_bytes((root / "a" / "2.png").read_bytes())  # same class: a plain copy
    report = convert(root, tmp_path / "train.beton", OPTS, split="train", progress=False)
    assert report["num_samples"] == 8  # reported, not dropped: which label is right is the user's call
    groups = {tuple(sorted(os.path.relpath(p, root) for p in g["paths"])): g for g in report["duplicate_content"]}
    assert set(groups) == {("a/1.png", "b/copy.png"), ("a/2.png", "a/copy.png")}
    assert groups[("a/1.png", "b/copy.png")]["across_classes"] and groups[("a/1.png", "b/copy.png")]["classes"] == [
        "a",
        "b",
    ]
    assert not groups[("a/2.png", "a/copy.png")]["across_classes"]


# --- 5. image kinds -----------------------------------------------------------------------------
def _kinds(folder):
    """{file name: the HxWx3 uint8 image a viewer shows}, each written in an odd format."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    expect = {}

    deep = rng.integers(0, 65536, (12, 10), dtype=np.uint16)  # 16-bit greyscale PNG
    Image.fromarray(deep).save(folder / "deep16.png")
    expect["deep16.png"] = np.repeat((deep >> 8).astype(np.uint8)[:, :, None], 3, axis=2)

    smooth = np.zeros((12, 10, 3), np.uint8)
    smooth[..., 0], smooth[..., 2] = np.linspace(0, 250, 10, dtype=np.uint8), 200
    Image.fromarray(smooth).convert("CMYK").save(folder / "cmyk.jpg", quality=100)  # CMYK JPEG
    expect["cmyk.jpg"] = smooth

    rgba = np.concatenate([rgb, rng.integers(0, 256, (12, 10, 1), dtype=np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(folder / "alpha.png")  # transparency: dropped
    expect["alpha.png"] = rgb

    palette = Image.fromarray(rgb).quantize(8)  # palette + transparent index
    palette.info["transparency"] = 0
    palette.save(folder / "palette.png", transparency=0)
    expect["palette.png"] = np.array(palette.convert("RGBA").convert("RGB"))

    tall = np.zeros((10, 20, 3), np.uint8)
    tall[:, :10] = (255, 0, 0)  # stored 20 wide, shown 20 tall
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise
    Image.fromarray(tall).save(folder / "rotated.jpg", exif=exif, quality=100)
    expect["rotated.jpg"] = np.rot90(tall, k=-1)  # red on top after the turn

    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]  # animations: first frame
    for name in ("anim.gif", "anim.webp"):
        frames[0].save(folder / name, save_all=True, append_images=frames[1:], duration=50, lossless=True)
        expect[name] = np.full((8, 8, 3), (255, 0, 0), np.uint8)

    Image.fromarray(rgb[:, :, 0]).save(folder / "grey.png")  # greyscale
    expect["grey.png"] = np.repeat(rgb[:, :, :1], 3, axis=2)
    Image.fromarray(rgb[:1, :1]).save(folder / "one_pixel.png")  # 1 x 1
    expect["one_pixel.png"] = rgb[:1, :1]
    Image.fromarray(rgb).save(folder / "UPPER.PNG")  # upper-case suffixes
    expect["UPPER.PNG"] = rgb
    Image.fromarray(smooth).save(folder / "UPPER.JPG", quality=100)
    expect["UPPER.JPG"] = smooth
    return expect


JPEG_TOLERANCE = 4  # mean absolute difference of a quality-100 JPEG of a smooth image


def test_image_kinds_convert_as_a_viewer_shows_them(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root, per_class=2)
    expect = _kinds(root / "a")
    Image.fromarray(rand_images(1, 8, 8, 1)[0]).save(root / "a" / ".hidden.png")  # hidden: not taken
    (root / "a" / ".cache").mkdir()
    Image.fromarray(rand_images(1, 8, 8, 1)[0]).save(root / "a" / ".cache" / "x.png")
    out = tmp_path / "train.beton"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. PIL's palette-transparency warning
        report = convert(root, out, dataclasses.replace(OPTS, workers=1), split="train", progress=False)
    assert report["skipped"] == [] and report["num_samples"] == 4 + len(expect)
    assert {os.path.basename(i["path"]): i["reason"] for i in report["ignored"]} == {
        ".cache": "hidden folder (not scanned)",
        ".hidden.png": "hidden file",
    }
    stored = stored_by_path(report, out)
    for name, image in expect.items():
        got = stored[str(root / "a" / name)]
        assert got.shape == image.shape, name
        diff = np.abs(got.astype(int) - image.astype(int)).mean()
        limit = JPEG_TOLERANCE if name.lower().endswith("jpg") else 0
        assert diff <= limit, (name, diff)
    assert np.array_equal(decode_file(root / "a" / "deep16.png"), expect["deep16.png"])  # the torchvision loader too


# --- the output folder: read-only, full ---------------------------------------------------------
@pytest.fixture
def mounted(tmp_path):
    """A small tmpfs at tmp_path/disk: mount(options) -> its path (root only: CI runs as root)."""
    mounts = []

    def mount(options):
        path = tmp_path / f"disk{len(mounts)}"
        path.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
        require(res.returncode == 0, f"cannot mount a tmpfs ({res.stderr.decode().strip()}): needs root")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_read_only_output_folder_fails_before_the_check_pass(tmp_path, mounted, monkeypatch):
    root = tmp_path / "train"
    make_imagefolder(root)
    disk = mounted("ro,size=1m")
    monkeypatch.setattr(conv, "check_images", lambda *a, **k: pytest.fail("checked images it could not write"))
    with pytest.raises(ConversionError, match=r"cannot write to .*disk0.*: Read-only file system"):
        convert(root, disk / "train.beton", OPTS, split="train", progress=False)


def test_too_small_disk_fails_before_writing(tmp_path, mounted):
    root = tmp_path / "train"
    make_imagefolder(root)
    disk = mounted("size=1m")  # FFCV writes 2 MiB pages
    with pytest.raises(ConversionError, match=r"needs at least 2\.0 MiB, only 1\.0 MiB are free"):
        convert(root, disk / "train.beton", OPTS, split="train", progress=False)
    assert os.listdir(disk) == []


@pytest.mark.timeout(180)  # a writer dying of a full disk must not leave FFCV waiting for ever
def test_disk_full_during_the_write_leaves_nothing_and_says_so(tmp_path, mounted, monkeypatch):
    root = tmp_path / "train"
    make_imagefolder(root)
    disk = mounted("size=1m")
    monkeypatch.setattr(conv, "require_space", lambda folder, needed: None)  # as if the disk filled meanwhile
    with pytest.raises(
        ConversionError,
        match=r"writing .*train\.beton failed: No space left on device"
        r".*the disk or quota is full.*nothing was written",
    ):
        convert(root, disk / "train.beton", OPTS, split="train", progress=False)
    assert os.listdir(disk) == [] and no_temporaries(disk)


# --- 4. paths with spaces and non-ASCII letters --------------------------------------------------
@pytest.mark.integration
def test_dataset_paths_with_spaces_and_non_ascii_letters_convert_through_the_rule(tmp_path):
    from test_convert import _snakemake_convert

    data = tmp_path / "my data" / "Bilder-ü"
    for split in ("train", "val"):
        make_imagefolder(data / split)
    _snakemake_convert(tmp_path, {"source": "imagefolder", "root": str(data)})
    report = json.loads((tmp_path / "results" / "data" / "ffcv" / "train.json").read_text())
    assert report["source"]["root"] == str(data / "train") and report["num_samples"] == 6


def test_scan_reports_unreadable_links(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root)
    os.symlink(tmp_path / "gone.png", root / "a" / "broken.png")
    src = open_source("imagefolder", root)
    assert len(src) == 6
    assert [i["path"] for i in src.ignored] == [str(root / "a" / "broken.png")]
    with pytest.raises(SourceError, match="not found"):
        open_source("imagefolder", tmp_path / "nowhere")
