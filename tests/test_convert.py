"""Conversion: every source kind, bad input, and no .beton that looks complete after a crash.

The fake CIFAR/STL copies are written in the real on-disk formats (python pickles, STL's
column-major binaries) with a handful of images. The .beton files are read back with FFCV's
Reader (metadata + raw pixels), without compiling a Loader: fast, and independent of loading.
"""

import dataclasses
import errno
import io
import json
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from pipeline.convert import ConversionError, SplitDataset, image_fields, main, write_beton
from pipeline.convert import run as convert
from pipeline.dag.sections import Convert
from pipeline.data.sources import decode_file, open_source

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = Convert(write_mode="raw", workers=1)


# --- fake datasets in their real formats -----------------------------------------------------
def rand_images(n, h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def make_cifar(root, kind="cifar10", per_file=2):
    """cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} or cifar-100-python/{train,test,meta}."""
    if kind == "cifar10":
        folder, files, meta = (
            root / "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
            {"label_names": [f"c{i}" for i in range(10)], "num_cases_per_batch": per_file, "num_vis": 3072},
        )
        meta_name, label_key, n_classes = "batches.meta", "labels", 10
    else:
        folder, files = root / "cifar-100-python", ["train", "test"]
        meta = {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": [f"g{i}" for i in range(20)]}
        meta_name, label_key, n_classes = "meta", "fine_labels", 100
    folder.mkdir(parents=True)
    written = {"train": ([], []), "test": ([], [])}
    for k, name in enumerate(files):
        images = rand_images(per_file, 32, 32, seed=k)
        labels = [(k * per_file + j) % n_classes for j in range(per_file)]
        entry = {
            "data": images.transpose(0, 3, 1, 2).reshape(per_file, 3072),
            label_key: labels,
            "filenames": [f"{name}_{j}.png" for j in range(per_file)],
        }
        if kind == "cifar100":
            entry["coarse_labels"] = [v // 5 for v in labels]
        (folder / name).write_bytes(pickle.dumps(entry))
        split = "test" if "test" in name else "train"
        written[split][0].append(images), written[split][1].extend(labels)
    (folder / meta_name).write_bytes(pickle.dumps(meta))
    return {s: (np.concatenate(x), y) for s, (x, y) in written.items()}


def make_stl10(root, n=3):
    """stl10_binary/{train,test}_{X,y}.bin, unlabeled_X.bin (column-major 3x96x96), class_names.txt."""
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    out = {}
    for k, split in enumerate(("train", "test", "unlabeled")):
        images = rand_images(n, 96, 96, seed=10 + k)
        (folder / f"{split}_X.bin").write_bytes(images.transpose(0, 3, 2, 1).tobytes())  # N, C, W, H
        labels = [(k + j) % 10 for j in range(n)] if split != "unlabeled" else [-1] * n
        if split != "unlabeled":
            (folder / f"{split}_y.bin").write_bytes(bytes(v + 1 for v in labels))  # 1-based on disk
        out[split] = (images, labels)
    (folder / "class_names.txt").write_text("\n".join(f"s{i}" for i in range(10)) + "\n")
    return out


def make_imagefolder(root, classes=("a", "b"), per_class=3, size=(20, 24), fmt="PNG"):
    paths = []
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(rand_images(per_class, *size, seed=c)):
            path = root / name / f"{i}.{fmt.lower()}"
            Image.fromarray(image).save(path, format=fmt)
            paths.append(path)
    return paths


def read_beton(path):
    """(images HxWx3, labels, indices, modes) straight from the file (raw pixels or JPEG bytes)."""
    from ffcv.reader import Reader

    reader = Reader(str(path))
    meta = reader.metadata
    sizes = {int(a["ptr"]): int(a["size"]) for a in reader.alloc_table}
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    images = []
    for field in meta["f0"]:
        ptr, h, w = int(field["data_ptr"]), int(field["height"]), int(field["width"])
        data = np.asarray(blob[ptr : ptr + sizes[ptr]])
        if field["mode"] == 1:  # raw
            images.append(data[: h * w * 3].reshape(h, w, 3))
        else:
            images.append(np.asarray(Image.open(io.BytesIO(data.tobytes())).convert("RGB")))
    return images, meta["f1"].tolist(), meta["f2"].tolist(), meta["f0"]["mode"].tolist()


def no_temporaries(folder):
    return not [p for p in os.listdir(folder) if p.endswith(".tmp")]


# --- image folders and bad input --------------------------------------------------------------
@pytest.fixture
def corrupt_tree(tmp_path):
    """Two classes of good images plus a truncated JPEG, a text file named .jpg, a zero-byte
    file and a README (not an image name)."""
    root = tmp_path / "train"
    good = make_imagefolder(root)
    Image.fromarray(rand_images(1, 64, 64, 5)[0]).save(root / "a" / "z_truncated.jpg", quality=95)
    data = (root / "a" / "z_truncated.jpg").read_bytes()
    (root / "a" / "z_truncated.jpg").write_bytes(data[: len(data) // 2])
    (root / "b" / "notes.jpg").write_text("this is not an image\n")
    (root / "b" / "empty.jpg").write_bytes(b"")
    (root / "b" / "README.txt").write_text("hello")
    return root, good


def test_corrupt_files_are_skipped_and_reported(corrupt_tree, tmp_path):
    root, good = corrupt_tree
    report = convert(root, tmp_path / "out" / "train.beton", RAW, progress=False)
    assert report["num_samples"] == len(good) == 6
    skipped = {os.path.basename(s["path"]): s["reason"] for s in report["skipped"]}
    assert set(skipped) == {"z_truncated.jpg", "notes.jpg", "empty.jpg"}
    assert "truncated" in skipped["z_truncated.jpg"].lower() or "OSError" in skipped["z_truncated.jpg"]
    assert [os.path.basename(s["path"]) for s in report["ignored"]] == ["README.txt"]
    assert report["counts_per_class"] == {"a": 3, "b": 3}
    assert report["resolution"]["source"]["min_hw"] == [20, 24]
    assert report["bytes"] == (tmp_path / "out" / "train.beton").stat().st_size
    assert report["source"] == {"kind": "imagefolder", "root": str(root.resolve()), "split": "train"}
    assert json.loads((tmp_path / "out" / "train.json").read_text()) == report
    images, labels, indices, _ = read_beton(tmp_path / "out" / "train.beton")
    assert labels == [0, 0, 0, 1, 1, 1] and indices == list(range(6))
    for image, path in zip(images, sorted(good)):
        assert np.array_equal(image, decode_file(path))


@pytest.mark.parametrize("workers", [1, 2])  # 2: the checking pool is terminated mid-way
def test_strict_fails_naming_the_file(corrupt_tree, tmp_path, workers):
    root, _ = corrupt_tree
    out = tmp_path / "out" / "train.beton"
    with pytest.raises(ConversionError, match="z_truncated.jpg"):
        convert(root, out, dataclasses.replace(RAW, workers=workers, strict=True), progress=False)
    assert not out.exists() and not out.with_suffix(".json").exists()
    with pytest.raises(SystemExit, match=r"error: unreadable image .*z_truncated\.jpg"):
        main(["--root", str(root), "--out", str(out), "--strict", "--config", json.dumps(dataclasses.asdict(RAW))])


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_root", "dataset split folder not found"),
        ("no_classes", "no class folders"),
        ("empty_class", "class 'b' has no images"),
        ("all_corrupt_class", r"class\(es\) \['b'\] have no readable images"),
        ("empty_unlabeled", "no images in the train split"),
        ("missing_cifar", "cifar10: torchvision folder .* not found"),
    ],
)
def test_clear_failures(tmp_path, case, message):
    root = tmp_path / "train"
    source = "imagefolder"
    if case == "no_classes":
        root.mkdir()
    elif case == "empty_class":
        make_imagefolder(root, classes=("a",))
        (root / "b").mkdir()
    elif case == "all_corrupt_class":
        make_imagefolder(root, classes=("a",))
        (root / "b").mkdir()
        (root / "b" / "x.png").write_bytes(b"not a png")
    elif case == "empty_unlabeled":
        (root / "sub").mkdir(parents=True)
        source = "unlabeled"
    elif case == "missing_cifar":
        root, source = tmp_path, "cifar10"
    with pytest.raises(ConversionError, match=message):
        convert(root, tmp_path / "out" / "train.beton", RAW, source=source, split="train", progress=False)
    assert not (tmp_path / "out" / "train.beton").exists()


def test_bad_option_names_the_key(tmp_path):
    with pytest.raises(SystemExit, match="convert.write_mode"):
        main(["--root", str(tmp_path), "--out", str(tmp_path / "x.beton"), "--config", '{"write_mode": "png"}'])


# --- a crash never leaves a .beton that looks complete ----------------------------------------
class FailingDataset(SplitDataset):
    """Raises (or, with ``hard``, dies by SIGKILL) in a writer process at sample ``fail_at``."""

    def __init__(self, source, fail_at, hard=False):
        super().__init__(source, None)
        self.fail_at, self.hard = fail_at, hard

    def __getitem__(self, i):
        if i == self.fail_at:
            if self.hard:  # as an OOM kill would, midway through the writing
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"simulated read error at sample {i}")
        return super().__getitem__(i)


@pytest.mark.timeout(120)  # a watchdog that missed the dead writer would leave FFCV waiting for ever
@pytest.mark.parametrize(
    "hard, message",
    [
        (False, "failed at sample 25: RuntimeError: simulated read error"),
        (True, r"writer process \d+ exited with code -9"),
    ],
)
def test_writer_failure_midway_leaves_no_beton(tmp_path, hard, message):
    with pytest.raises(ConversionError, match=message):
        write_failing(tmp_path, hard)
    out = tmp_path / "out" / "train.beton"
    assert not out.exists() and no_temporaries(out.parent)


def write_failing(tmp_path, hard):
    """Write 40 images on 2 writers; sample 25 fails (hard: its writer is killed)."""
    make_imagefolder(tmp_path / "src", per_class=20, size=(16, 16))
    src = open_source("imagefolder", tmp_path / "src")
    fields = image_fields(RAW)
    write_beton(FailingDataset(src, fail_at=25, hard=hard), tmp_path / "out" / "train.beton", fields, 2, chunksize=4)


HELD_CONVERT = """
import signal, sys
from pipeline import convert as c
from pipeline.dag.sections import Convert
get = c.SplitDataset.__getitem__
def held(self, i):  # the writer stops halfway (sample 100 of 200) and says so
    if i == 100:
        print("writing sample 100", flush=True)
        signal.pause()  # until the test kills the process group
    return get(self, i)
c.SplitDataset.__getitem__ = held
c.run(sys.argv[1], sys.argv[2], Convert(write_mode="raw", workers=1), progress=False)
"""


@pytest.mark.timeout(300)
def test_killed_conversion_leaves_no_beton(tmp_path):
    make_imagefolder(tmp_path / "src", per_class=100, size=(16, 16))
    out = tmp_path / "out" / "train.beton"
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_CONVERT, str(tmp_path / "src"), str(out)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in proc.stdout:  # until the writer is halfway through
            lines.append(line)
            if line.endswith("writing sample 100\n"):  # after the progress bar (\r, no newline)
                break
        else:
            raise AssertionError(f"the conversion ended before it was halfway:\n{''.join(lines)[-2000:]}")
        assert not no_temporaries(out.parent), "halfway, and no temporary file is being written"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    assert not out.exists() and not out.with_suffix(".json").exists()
    # the next run cleans the killed run's temporary and completes
    convert(tmp_path / "src", out, RAW, progress=False)
    assert out.exists() and no_temporaries(out.parent)


# --- torchvision copies, unlabeled folders, write options --------------------------------------
@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
def test_cifar(tmp_path, kind):
    truth = make_cifar(tmp_path / "tv", kind)
    for split, part in (("train", "train"), ("val", "test")):
        out = tmp_path / "out" / f"{split}.beton"
        report = convert(tmp_path / "tv", out, RAW, source=kind, split=split, progress=False)
        images, labels, indices, _ = read_beton(out)
        x, y = truth[part]
        assert labels == y and indices == list(range(len(y)))
        assert np.array_equal(np.stack(images), x)
        assert report["classes"][:2] == (["c0", "c1"] if kind == "cifar10" else ["f0", "f1"])
        assert report["source"]["kind"] == kind and report["num_samples"] == len(y)
        assert any("checksums" in n for n in report["notes"])  # not the official files


def test_stl10(tmp_path):
    truth = make_stl10(tmp_path / "tv")
    for split, parts in (
        ("train", ["train"]),
        ("val", ["test"]),
        ("unlabeled", ["unlabeled"]),
        ("train+unlabeled", ["train", "unlabeled"]),
    ):
        out = tmp_path / "out" / f"{split}.beton"
        report = convert(
            tmp_path / "tv",
            out,
            dataclasses.replace(RAW, max_resolution=None),  # 96 px, stored as is
            source="stl10",
            split=split,
            progress=False,
        )
        images, labels, indices, _ = read_beton(out)
        assert np.array_equal(np.stack(images), np.concatenate([truth[p][0] for p in parts]))
        assert labels == sum((truth[p][1] for p in parts), [])
        assert report["num_unlabeled"] == (3 if "unlabeled" in split else 0)
        assert report["classes"] == [f"s{i}" for i in range(10)]


def test_unlabeled_folder(tmp_path):
    root = tmp_path / "train"
    make_imagefolder(root / "any" / "depth", classes=("x",), per_class=2)
    make_imagefolder(root, classes=("y",), per_class=3, fmt="JPEG")
    report = convert(root, tmp_path / "out" / "train.beton", RAW, source="unlabeled", progress=False)
    assert report["num_samples"] == report["num_unlabeled"] == 5 and report["classes"] == []
    _, labels, indices, _ = read_beton(tmp_path / "out" / "train.beton")
    assert labels == [-1] * 5 and indices == list(range(5))


def test_write_modes_and_resolution(tmp_path):
    make_imagefolder(tmp_path / "src", per_class=4, size=(64, 48))
    small = convert(tmp_path / "src", tmp_path / "raw.beton", Convert(workers=1, max_resolution=32), progress=False)
    assert small["options"]["write_mode"] == "raw"  # auto: small split -> raw pixels
    assert small["resolution"]["stored"]["max_hw"] == [32, 24]
    images, *_ = read_beton(tmp_path / "raw.beton")
    assert images[0].shape == (32, 24, 3)
    jpg = convert(
        tmp_path / "src",
        tmp_path / "jpg.beton",
        Convert(workers=1, write_mode="jpg", jpeg_quality=50, max_resolution=32),
        progress=False,
    )
    images, labels, _, modes = read_beton(tmp_path / "jpg.beton")
    assert set(modes) == {0} and images[0].shape == (32, 24, 3) and labels == [0] * 4 + [1] * 4
    assert jpg["options"]["jpeg_quality"] == 50
    smart = convert(
        tmp_path / "src",
        tmp_path / "smart.beton",
        Convert(workers=1, write_mode="smart", smart_threshold=100),
        progress=False,
    )
    assert set(read_beton(tmp_path / "smart.beton")[3]) == {0}  # every image is above 100 bytes -> JPEG
    assert smart["options"]["write_mode"] == "smart"


def test_report_only(tmp_path):
    make_imagefolder(tmp_path / "src")
    report = convert(tmp_path / "src", tmp_path / "train.beton", RAW, beton=False, progress=False)
    assert report["beton"] is None and report["num_samples"] == 6
    assert not (tmp_path / "train.beton").exists() and (tmp_path / "train.json").is_file()


# --- the convert rule, for every source kind ---------------------------------------------------
def _snakemake_convert(tmp_path, dataset: dict, *args, splits=("train", "val")):
    """The convert jobs of both splits for this dataset section (a config file: --config
    would pass nested values as strings)."""
    from conftest import run, snakemake_cli

    results = tmp_path / "results"
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        json.dumps(
            {
                "results": str(results),
                "dataset": dataset,
                "detect": {"enabled": False},
                "convert": {"workers": 1, "write_mode": "raw"},
            }
        )
    )
    targets = [str(results / "data" / "ffcv" / f"{s}.json") for s in splits]
    return run(
        [
            *snakemake_cli(),
            "--configfile",
            "workflow/config/presets/tiny.yaml",
            str(extra),
            "--cores",
            "1",
            "-p",
            *args,
            *targets,
        ],
        timeout=600,
    )


@pytest.mark.integration
def test_convert_rule_dry_runs_every_kind(tmp_path):
    make_stl10(tmp_path / "stl")
    for dataset, expect in [
        ({"source": "cifar10", "root": str(tmp_path)}, f"--source cifar10 --root {tmp_path} --split val"),
        ({"source": "stl10", "root": str(tmp_path / "stl"), "stl10_unlabeled": True}, "--split train+unlabeled"),
        ({"source": "unlabeled", "root": str(tmp_path)}, f"--source unlabeled --root {tmp_path}/train --split train"),
        ({"source": "imagefolder", "root": str(tmp_path)}, f"--source imagefolder --root {tmp_path}/val --split val"),
    ]:
        out = _snakemake_convert(tmp_path, dataset, "-n").stdout
        assert expect in out, out[-3000:]


@pytest.mark.integration
def test_convert_rule_runs_on_stl10(tmp_path):
    make_stl10(tmp_path / "stl")
    _snakemake_convert(tmp_path, {"source": "stl10", "root": str(tmp_path / "stl")}, splits=("val",))
    report = json.loads((tmp_path / "results" / "data" / "ffcv" / "val.json").read_text())
    assert report["source"] == {"kind": "stl10", "root": str((tmp_path / "stl").resolve()), "split": "val"}
    assert report["num_samples"] == 3 and report["classes"][0] == "s0"
    assert (tmp_path / "results" / "data" / "ffcv" / "val.beton").is_file()


# --- error paths and corner cases, each named by what it must do ------------------------------
def test_unreadable_cifar_copy_names_the_folder_and_the_error(tmp_path):
    """A copy that fails the checksums is read unverified; if even that fails, the error
    names the folder and what went wrong (not a torchvision traceback)."""
    from pipeline.data.sources import SourceError

    make_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(SourceError, match=r"cifar10: cannot read .*cifar-10-batches-py: UnpicklingError"):
        open_source("cifar10", tmp_path, "train")


def test_other_torchvision_errors_are_not_taken_for_checksums(tmp_path):
    """Only torchvision's "corrupted" error means "read unverified"; any other propagates."""
    from pipeline.data.sources import _torchvision_copy

    class Broken:
        base_folder = "broken"

        def __init__(self, *args, **kwargs):
            raise RuntimeError("the disk went away")

    (tmp_path / "broken").mkdir()
    notes: list = []
    with pytest.raises(RuntimeError, match="the disk went away"):
        _torchvision_copy(Broken, tmp_path, "cifar10", notes)
    assert notes == []


@pytest.mark.parametrize(
    "kind, split, message",
    [
        ("cifar100", "unlabeled", r"cifar100: unknown split 'unlabeled' \(train, val = test\)"),
        ("stl10", "extra", r"stl10: unknown split 'extra' \(train, val, test, unlabeled, train\+unlabeled\)"),
        ("lmdb", "train", r"unknown dataset source kind 'lmdb' \(one of imagefolder, .*stl10"),
    ],
)
def test_unknown_split_or_kind_is_named(tmp_path, kind, split, message):
    from pipeline.data.sources import SourceError

    with pytest.raises(SourceError, match=message):
        open_source(kind, tmp_path, split)


def test_large_jpeg_is_decoded_at_a_reduced_scale(tmp_path):
    """max_side 16 of a 64 x 48 JPEG: libjpeg's 1/4 scale is the smallest that keeps the
    longest side >= 16, so 16 x 12 is decoded; size_out still has the full (h, w)."""
    path = tmp_path / "big.jpg"
    Image.fromarray(rand_images(1, 48, 64, seed=0)[0]).save(path, quality=95)
    size: list = []
    assert decode_file(path, max_side=16, size_out=size).shape == (12, 16, 3)
    assert size == [(48, 64)]
    assert decode_file(path).shape == (48, 64, 3)


def test_wider_than_16_bit_greyscale_is_stretched_to_8_bits():
    """Values beyond 16 bits: (v - min) * 255 // (max - min), by hand for 0, 50000, 100000, 200000."""
    from pipeline.data.sources import to_rgb

    image = Image.fromarray(np.array([[0, 100000], [50000, 200000]], dtype=np.int32), mode="I")
    assert to_rgb(image)[..., 0].tolist() == [[0, 127], [63, 255]]
    assert (to_rgb(image) == to_rgb(image)[..., :1]).all()  # grey: three equal channels


def test_split_with_no_readable_image_names_the_split(tmp_path):
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "x.png").write_bytes(b"not a png")
    with pytest.raises(ConversionError, match=r"no readable images in split 'train' \(1 skipped\)"):
        convert(tmp_path / "u", tmp_path / "out.beton", RAW, source="unlabeled", split="train", progress=False)
    assert not (tmp_path / "out.beton").exists()


def test_auto_write_mode_beyond_the_raw_budget_is_proportion():
    from pipeline.convert import RAW_BUDGET, resolve_write_mode
    from pipeline.dag.sections import Convert

    assert resolve_write_mode(Convert(), 1 << 20) == ("raw", "auto: raw pixels take 1 MiB <= 4096 MiB")
    assert resolve_write_mode(Convert(), RAW_BUDGET + 1) == (
        "proportion",
        "auto: raw pixels would take 4.0 GiB > 4 GiB",
    )


def test_page_size_doubles_until_it_holds_two_samples():
    from pipeline.convert import MIN_PAGE, page_size_for

    assert page_size_for(MIN_PAGE // 2, 0) == MIN_PAGE
    assert page_size_for(3 * MIN_PAGE, 0) == 8 * MIN_PAGE  # 1, 2, 4 pages < 6: doubled to 8
    assert page_size_for(1, 1 << 30) == 1 << 23


@pytest.mark.parametrize(
    "raised, expected",
    [
        (OSError(28, "No space left on device", "/x/train.beton.tmp"), "the disk or quota is full"),
        (ValueError("bad field"), None),
    ],
)
def test_write_errors_in_the_main_process(tmp_path, monkeypatch, raised, expected):
    """An OSError of the write becomes a ConversionError that says why (a full disk: where);
    any other error propagates as it is. Either way no .beton is left."""
    import ffcv.writer

    def fail(self, *args, **kwargs):
        raise raised

    monkeypatch.setattr(ffcv.writer.DatasetWriter, "from_indexed_dataset", fail)
    make_imagefolder(tmp_path / "src", per_class=2, size=(8, 8))
    src = open_source("imagefolder", tmp_path / "src")
    out = tmp_path / "out" / "train.beton"
    error = ConversionError if expected else type(raised)
    with pytest.raises(error) as info:
        write_beton(SplitDataset(src, None), out, image_fields(RAW))
    if expected:
        assert f"writing {out} failed: No space left on device (/x/train.beton.tmp) - {expected}" in str(info.value)
    else:
        assert info.value is raised
    assert not out.exists() and no_temporaries(out.parent)


def test_describe_error_of_a_non_os_error_is_its_text():
    from pipeline.convert import describe_error

    assert describe_error(ValueError("bad field")) == "bad field"
    assert describe_error("RuntimeError: boom") == "RuntimeError: boom"  # as a writer reports it


def _paused_writer(ready, ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    signal.pause()  # blocks until a signal


def _live_writer(ignore_sigterm: bool = False):
    import multiprocessing as mp

    from pipeline.convert import _Watchdog

    ctx = mp.get_context("fork")
    ready = ctx.Event()
    writer = ctx.Process(target=_paused_writer, args=(ready, ignore_sigterm))
    writer.start()
    assert ready.wait(60), "the writer process never started"
    watchdog = _Watchdog(expected=1)
    watchdog.started.append(writer)
    return watchdog, writer


def test_kill_workers_terminates_a_live_writer():
    watchdog, writer = _live_writer()
    watchdog.kill_workers()
    assert writer.exitcode == -signal.SIGTERM


def test_kill_workers_kills_a_writer_that_outlives_sigterm(monkeypatch):
    """A writer whose SIGTERM was lost (ignored here) is killed once the grace time is over."""
    from pipeline import convert

    monkeypatch.setattr(convert, "KILL_GRACE_S", 0.2)
    watchdog, writer = _live_writer(ignore_sigterm=True)
    watchdog.kill_workers()
    assert writer.exitcode == -signal.SIGKILL


def _writer_out_of_space(reading) -> None:
    reading.wait()  # until the main thread is about to block in its read
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.timeout(60)  # without the fix: the main thread waits for ever
def test_a_writer_dying_while_the_main_thread_blocks_in_a_read_is_caught():
    """Once every sample is counted, FFCV waits for each writer's allocations in a blocking
    queue read; a writer that fills the disk with its last page dies during that read (the
    full-disk test hung there once in a full suite run). The watchdog must interrupt the read."""
    import multiprocessing as mp

    from pipeline.convert import _Watchdog
    from pipeline.data import ffcv_runtime

    ffcv_runtime.load()
    import ffcv.writer

    ctx = mp.get_context("fork")
    reading, never_fed = ctx.Event(), ctx.Queue()
    watchdog = _Watchdog(expected=1)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), watchdog:
        ffcv.writer.Process(target=_writer_out_of_space, args=(reading,)).start()
        reading.set()
        never_fed.get()
    assert watchdog.failed and "No space left on device" in watchdog.reason()
    assert signal.getsignal(signal.SIGINT) == before


def test_released_shared_memory_may_already_be_gone():
    """FFCV may have unlinked its metadata block itself: releasing it again is no error."""
    from multiprocessing.shared_memory import SharedMemory
    from types import SimpleNamespace

    from pipeline.convert import _release_shared_memory

    shm = SharedMemory(create=True, size=16)
    shm.unlink()
    _release_shared_memory(SimpleNamespace(metadata_sm=shm))
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=shm.name)


@pytest.mark.timeout(60)  # without the fix: FFCV's writer waits for ever
def test_dead_writer_is_caught_while_sigint_is_ignored(tmp_path):
    """A job started in the background of a shell (nohup ... &) ignores SIGINT, and then the
    watchdog's SIGINT does nothing: it installs Python's handler while it watches."""
    out = tmp_path / "out" / "train.beton"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(ConversionError, match=r"writer process \d+ exited with code -9"):
            write_failing(tmp_path, hard=True)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not out.exists() and no_temporaries(out.parent)
