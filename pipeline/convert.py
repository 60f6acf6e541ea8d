"""Convert one dataset split to an FFCV ``.beton`` (fields: image, label, sample index).

Two passes, both parallel with a progress bar: every image is first decoded once (bad files
are found before anything is written: unreadable, truncated or non-image files are listed in
the report and skipped, or with ``strict`` the conversion fails naming the file), then FFCV's
writer stores the good ones. The ``.beton`` is written under a temporary name and renamed at
the end, so a crash or a kill never leaves a file that looks complete; a JSON report next to
it records the source (kind, root, split: what the torchvision loader reopens), counts per
class, skipped files and why, resolution statistics and sizes.

    python -m pipeline.convert --source imagefolder --root results/data/synthetic/cls/train \\
        --split train --out results/data/ffcv/train.beton [--config '{"max_resolution": 64}'] [--strict]
    python -m pipeline.convert --source cifar10 --root ~/torchvision-data --split val --out ffcv/val.beton
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipeline.dag.sections import Convert
from pipeline.data.sources import KINDS, UNLABELED, Source, SourceError, open_source
from pipeline.runtime.io import atomic_path, atomic_write_json
from pipeline.runtime.stage_log import stage_log

# write_mode auto: raw pixels (no decoding cost when loading) while the whole split stays
# below RAW_BUDGET bytes, i.e. comfortably in the page cache; above it FFCV's ImageNet recipe
# (half the images JPEG-compressed). smart: JPEG for images above smart_threshold bytes.
RAW_BUDGET = 4 << 30
MIN_PAGE = 1 << 21  # FFCV's minimum; its 8 MiB default pads small datasets heavily
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class ConversionError(RuntimeError):
    pass


log = stage_log("convert", stderr=True)


# --- pass 1: decode every image once ------------------------------------------------------
def _probe(i: int) -> tuple[int, tuple | str]:
    """(i, ((h, w), digest)) for a readable item, (i, reason) for a bad one (runs in pool workers)."""
    source, max_side = _PROBE
    try:
        return i, source.probe(i, max_side)
    except Exception as err:  # PIL raises many types for bad files
        return i, f"{type(err).__name__}: {err}"


_PROBE: tuple = (None, None)  # (source, max_side), set before the pool forks: nothing is pickled


class Checked(NamedTuple):
    good: list[int]  # positions of the readable items
    shapes: list[tuple[int, int]]  # their (h, w) as displayed
    digests: list[str | None]  # their content's SHA-1 (None: not computed)
    skipped: list[dict]  # the unreadable ones, with reasons


def check_images(
    source: Source, strict: bool, workers: int = 1, progress: bool = True, max_side: int | None = None
) -> Checked:
    """Each image decoded as the writer will decode it (see decode_file)."""
    from tqdm import tqdm

    if source.verified:
        probed = [source.probe(i) for i in range(len(source))]
        return Checked(list(range(len(source))), [p[0] for p in probed], [p[1] for p in probed], [])
    global _PROBE
    _PROBE = (source, max_side)
    good, shapes, digests, skipped = [], [], [], []
    bar = tqdm(total=len(source), desc="convert: checking", disable=not progress, mininterval=2)
    pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
    complete = False
    try:
        results = pool.imap(_probe, range(len(source)), chunksize=32) if pool else map(_probe, range(len(source)))
        for i, res in results:
            bar.update()
            if isinstance(res, tuple):
                good.append(i)
                shapes.append(res[0])
                digests.append(res[1])
            elif strict:
                raise ConversionError(f"unreadable image {source.key(i)}: {res}")
            else:
                skipped.append({"path": source.key(i), "reason": res})
        complete = True
    finally:
        bar.close()
        if pool:
            # every result is in: the workers take their sentinels and exit (terminate() holds the
            # task queue's lock while it signals them, and joins them: kept for the error path)
            if complete:
                pool.close()
            else:
                pool.terminate()
            pool.join()
        _PROBE = (None, None)
    return Checked(good, shapes, digests, skipped)


def duplicate_content(source: Source, checked: Checked) -> list[dict]:
    """Groups of items with identical bytes; those under two labels are usually a labelling error."""
    groups: dict[str, list[int]] = {}
    for i, digest in zip(checked.good, checked.digests):
        if digest is not None:
            groups.setdefault(digest, []).append(i)
    out = []
    for digest, items in groups.items():
        if len(items) > 1:
            labels = sorted({source.labels[i] for i in items})
            out.append(
                {
                    "sha1": digest,
                    "paths": [source.key(i) for i in items],
                    "classes": [source.classes[k] if k != UNLABELED else None for k in labels],
                    "across_classes": len(labels) > 1,
                }
            )
    return out


# --- pass 2: the FFCV writer ---------------------------------------------------------------
class SplitDataset:
    """What FFCV's DatasetWriter indexes: (image HxWx3 uint8, label, sample index)."""

    def __init__(self, source: Source, max_side: int | None):
        self.source, self.max_side = source, max_side

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return fit(self.source.load(i, self.max_side), self.max_side), int(self.source.labels[i]), int(i)


def fit(image: np.ndarray, max_resolution: int | None) -> np.ndarray:
    """The image at the size FFCV stores (see stored_shape), scaled as FFCV's writer would
    scale it (OpenCV, INTER_AREA). Done here because FFCV's writer would ask OpenCV for a
    0-pixel side on a very elongated image (4000x8 at 64 px) and kill its process; the writer
    then has nothing left to scale."""
    import cv2

    h, w = image.shape[:2]
    th, tw = stored_shape((h, w), max_resolution)
    if (th, tw) == (h, w):
        return image
    return cv2.resize(image, (tw, th), interpolation=cv2.INTER_AREA)


class _Guarded:
    """Wraps the dataset in FFCV's writer processes: an exception there would kill the worker
    and leave FFCV's writer waiting for ever, so it is recorded instead (the sample gets a
    1-pixel placeholder) and the conversion fails once the writer returns."""

    def __init__(self, dataset, errors):
        self.dataset, self.errors = dataset, errors

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        try:
            return self.dataset[i]
        except Exception as err:
            self.errors.put(f"sample {i}: {type(err).__name__}: {err}")
            return np.zeros((1, 1, 3), np.uint8), 0, int(i)


KILL_GRACE_S = 5.0  # how long a terminated writer may take to exit before it is killed


class _Watchdog:
    """A writer process that dies without an exception (OOM kill, signal) also leaves FFCV's
    writer waiting for ever (it polls a shared counter). While installed, the watchdog records
    exactly the processes FFCV's writer starts (its ``Process`` is swapped for a recording
    subclass); once all ``expected`` are started, a thread polls them and interrupts the main
    thread when one exits with an error code. The thread starts only after the last fork, so
    no thread of ours is alive while a worker is forked (a lock it held would be copied locked)."""

    def __init__(self, expected: int):
        self.expected = expected
        self.started: list = []  # the writer processes started so far
        self.failed: str | None = None
        self.crashes = mp.get_context("fork").SimpleQueue()  # why a writer process died
        self.lock, self.done = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        import ffcv.writer

        watchdog, self.original = self, ffcv.writer.Process

        class Recorded(self.original):  # type: ignore[name-defined]  # FFCV's Process, found at run time
            def start(self):
                super().start()
                watchdog.started.append(self)
                if len(watchdog.started) == watchdog.expected:
                    watchdog.thread.start()

            def run(self):  # in the writer process: its error goes into the message, not a traceback
                try:
                    super().run()
                except BaseException as err:
                    watchdog.crashes.put(err if isinstance(err, OSError) else f"{type(err).__name__}: {err}")
                    os._exit(1)

        ffcv.writer.Process = Recorded
        # a SIGINT does nothing while it is ignored (a job started in the background of a
        # shell, nohup ... &): the wait for a dead writer would never end
        self.sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.waiting = threading.get_ident()  # the main thread (signal.signal works in no other)
        return self

    def __exit__(self, *exc):
        import ffcv.writer

        ffcv.writer.Process = self.original
        try:
            with self.lock:  # a SIGINT the thread sends meanwhile is raised here
                self.done.set()
        finally:
            signal.signal(signal.SIGINT, self.sigint)

    def _run(self):
        while not self.done.wait(0.1):
            dead = [p for p in self.started if p.exitcode not in (None, 0)]
            if dead:
                with self.lock:
                    if not self.done.is_set():
                        self.failed = f"writer process {dead[0].pid} exited with code {dead[0].exitcode}"
                        # a real signal: _thread.interrupt_main only marks SIGINT pending, and a main
                        # thread blocked in a read (FFCV's wait for the writers' allocations once
                        # every sample is counted) would never get back to run the handler
                        signal.pthread_kill(self.waiting, signal.SIGINT)
                return

    def reason(self) -> str:
        """What went wrong, in words: the writer's own error where it reported one."""
        if self.crashes.empty():
            return self.failed or "a writer process failed"
        return describe_error(self.crashes.get())

    def kill_workers(self) -> None:
        """SIGTERM, then SIGKILL for any writer still alive after KILL_GRACE_S: a SIGTERM that
        lands between a fork and the child's reset of its inherited handlers (preempt) is lost."""
        for p in self.started:
            if p.is_alive():
                p.terminate()
        for p in self.started:
            p.join(KILL_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()


def page_size_for(max_sample_bytes: int, total_bytes: int) -> int:
    """Pages must hold the largest sample; bigger pages (8 MiB) only for large datasets."""
    size = MIN_PAGE if total_bytes < (1 << 30) else 1 << 23
    while size < 2 * max_sample_bytes:
        size *= 2
    return size


def write_beton(
    dataset, out: Path, fields: dict, workers: int = 1, page_size: int = MIN_PAGE, chunksize: int = 64
) -> None:
    """Write ``dataset`` (items: one value per field) to ``out`` atomically: on any failure
    the temporary file is removed and ``out`` is left as it was."""
    from pipeline.data import ffcv_runtime

    ffcv_runtime.load()
    from ffcv.writer import DatasetWriter

    errors: mp.Queue = mp.Queue()
    with atomic_path(out) as tmp:
        writer = DatasetWriter(str(tmp), fields, num_workers=workers, page_size=page_size)
        watchdog = _Watchdog(expected=workers)
        try:
            with watchdog:
                writer.from_indexed_dataset(_Guarded(dataset, errors), chunksize=chunksize)
        except BaseException as err:
            watchdog.kill_workers()
            _release_shared_memory(writer)
            if isinstance(err, KeyboardInterrupt) and watchdog.failed:
                raise ConversionError(f"writing {out} failed: {watchdog.reason()}; nothing was written") from None
            if isinstance(err, OSError):
                raise ConversionError(f"writing {out} failed: {describe_error(err)}; nothing was written") from None
            raise
        failures = _drain(errors)
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise ConversionError(f"writing {out} failed at {failures[0]}{more}")


def describe_error(err) -> str:
    """An error of the write in words; a full disk says where and how much is free."""
    if not isinstance(err, OSError):
        return str(err)
    text = f"{err.strerror or err}"
    if err.errno in DISK_FULL:
        where = f" ({err.filename})" if err.filename else ""
        text += f"{where} - the disk or quota is full: free space or choose another results folder"
    return text


def require_writable(folder: Path) -> None:
    """Fail before the check pass (hours on a large split) if the output folder takes no file."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConversionError(f"cannot write to {folder}: {err.strerror or err}") from None


def require_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ConversionError(
            f"{folder}: the .beton needs at least {needed / 2**20:.1f} MiB, only "
            f"{free / 2**20:.1f} MiB are free: free space or choose another results folder"
        )


def least_bytes(opts: Convert, stored: np.ndarray, writers: int, page: int) -> int:
    """A lower bound of the .beton's size: the pixels stored raw (JPEG sizes are unknown
    before encoding) and a page per writer."""
    raw = stored[:, 0] * stored[:, 1] * 3
    raw_share = {
        "raw": raw.sum(),
        "proportion": (1 - opts.compress_probability) * raw.sum(),
        "smart": raw[raw <= opts.smart_threshold].sum(),
    }.get(opts.write_mode, 0)
    return int(raw_share) + min(writers, len(stored)) * page


def _drain(queue) -> list[str]:
    import queue as q

    out = []
    while True:
        try:
            out.append(queue.get(timeout=0.05))  # the workers have exited: all is in the pipe
        except q.Empty:
            return out


def _release_shared_memory(writer) -> None:
    """The writer's metadata block outlives an unfinished write otherwise."""
    shm = getattr(writer, "metadata_sm", None)
    if shm is not None and hasattr(shm, "unlink"):
        try:
            shm.close()
            shm.unlink()
        except FileNotFoundError:
            pass


def image_fields(opts: Convert) -> dict:
    from pipeline.data import ffcv_runtime

    ffcv_runtime.load()
    from ffcv.fields import IntField, RGBImageField

    return {
        "image": RGBImageField(
            write_mode=opts.write_mode,
            max_resolution=opts.max_resolution,
            jpeg_quality=opts.jpeg_quality,
            smart_threshold=opts.smart_threshold,
            compress_probability=opts.compress_probability,
        ),
        "label": IntField(),
        "index": IntField(),
    }


# --- the stage -----------------------------------------------------------------------------
def stored_shape(hw, max_resolution: int | None) -> tuple[int, int]:
    """The (h, w) stored: longest side scaled down to max_resolution (never up), rounded down
    as FFCV's writer does, but never below 1 pixel."""
    h, w = hw
    if max_resolution and max(h, w) > max_resolution:
        r = max_resolution / max(h, w)
        return max(1, int(h * r)), max(1, int(w * r))
    return h, w


def _hw_stats(shapes: np.ndarray) -> dict:
    return {
        "min_hw": shapes.min(0).tolist(),
        "max_hw": shapes.max(0).tolist(),
        "mean_hw": [round(float(v), 1) for v in shapes.mean(0)],
    }


def resolve_write_mode(opts: Convert, raw_bytes: int) -> tuple[str, str]:
    if opts.write_mode != "auto":
        return opts.write_mode, "configured"
    if raw_bytes <= RAW_BUDGET:
        return "raw", f"auto: raw pixels take {raw_bytes / 2**20:.0f} MiB <= {RAW_BUDGET >> 20} MiB"
    return "proportion", f"auto: raw pixels would take {raw_bytes / 2**30:.1f} GiB > {RAW_BUDGET >> 30} GiB"


def remove_stale_temporaries(out: Path) -> None:
    """Temporaries of a killed conversion (atomic_path's .<name>.*.tmp) are garbage."""
    for tmp in out.parent.glob(f".{out.name}.*.tmp"):
        tmp.unlink(missing_ok=True)


def run(
    root,
    out,
    opts: Convert | None = None,
    source: str = "imagefolder",
    split: str | None = None,
    progress: bool = True,
    beton: bool = True,
) -> dict:
    """Convert one split; returns the report (also written next to ``out`` as .json).

    ``beton=False`` checks the images and writes only the report (enough for the torchvision
    loader where FFCV is not installed). ``opts``: the convert section (None: the defaults).
    """
    opts = opts or Convert()
    out = Path(out)
    split = split or out.stem
    t0 = time.perf_counter()
    require_writable(out.parent)
    try:
        src = open_source(source, root, split)
    except SourceError as err:
        raise ConversionError(str(err)) from None
    for note in src.notes:
        log(f"note: {note}")
    duplicates = src.duplicates
    if duplicates:
        log(
            f"note: {len(duplicates)} file(s) or folder(s) reached twice through links were taken once "
            f"(e.g. {duplicates[0]['path']} = {duplicates[0]['same_as']}; report: duplicates)"
        )
    checked = check_images(src, opts.strict, opts.workers, progress, opts.max_resolution)
    good, shapes, skipped = checked.good, checked.shapes, checked.skipped
    same_content = duplicate_content(src, checked)
    conflicts = [g for g in same_content if g["across_classes"]]
    if conflicts:
        log(
            f"warning: {len(conflicts)} image(s) stored under two or more classes with identical bytes "
            f"(a labelling error?), e.g. {' = '.join(conflicts[0]['paths'][:2])}; report: duplicate_content"
        )
    if not good:
        raise ConversionError(f"{src.root}: no readable images in split '{split}' ({len(skipped)} skipped)")
    kept = src.select(good)
    counts = Counter(kept.labels)
    found = Counter(src.labels)
    empty = [name for k, name in enumerate(src.classes) if found.get(k, 0) and not counts.get(k, 0)]
    if empty:
        raise ConversionError(f"{src.root}: class(es) {empty} have no readable images (see the skipped files)")

    hw = np.array(shapes)
    stored = np.array([stored_shape(s, opts.max_resolution) for s in shapes])
    raw_bytes = int((stored[:, 0] * stored[:, 1] * 3).sum())
    mode, why = resolve_write_mode(opts, raw_bytes)
    opts = dataclasses.replace(opts, write_mode=mode)
    page = page_size_for(int((stored[:, 0] * stored[:, 1]).max() * 3), raw_bytes)
    t_check = time.perf_counter() - t0
    out.with_suffix(".json").unlink(missing_ok=True)  # never a report beside another run's .beton
    if beton:
        out.unlink(missing_ok=True)
        remove_stale_temporaries(out)
        # Each writer process fills pages of its own: on a small split extra writers only add
        # padding (a page or two each), so use one per 16 pages of pixels.
        writers = max(1, min(opts.workers, raw_bytes // (16 * page)))
        chunk = max(16, min(256, len(good) // (8 * writers)))
        require_space(out.parent, least_bytes(opts, stored, writers, page))
        write_beton(SplitDataset(kept, opts.max_resolution), out, image_fields(opts), writers, page, chunk)
    t_write = time.perf_counter() - t0 - t_check

    labeled = [k for k in kept.labels if k != UNLABELED]
    report = {
        "source": src.describe(),
        "beton": str(out) if beton else None,
        "num_samples": len(good),
        "num_unlabeled": len(good) - len(labeled),
        "classes": src.classes,
        "counts_per_class": {name: counts.get(k, 0) for k, name in enumerate(src.classes)},
        "skipped": skipped,
        "ignored": src.ignored,
        "duplicates": duplicates,
        "duplicate_content": same_content,
        "notes": src.notes,
        "sample_keys_sha1": kept.digest(),
        "resolution": {"source": _hw_stats(hw), "stored": _hw_stats(stored)},
        "bytes": out.stat().st_size if beton else 0,
        "raw_pixel_bytes": raw_bytes,
        "options": {
            "max_resolution": opts.max_resolution,
            "jpeg_quality": opts.jpeg_quality,
            "write_mode": mode,
            "write_mode_reason": why,
            "compress_probability": opts.compress_probability,
            "smart_threshold": opts.smart_threshold,
            "page_size": page,
            "workers": opts.workers,
            "writers": writers if beton else 0,
            "strict": opts.strict,
        },
        "fields": {"image": "RGBImageField", "label": "IntField", "index": "IntField (position in this file)"},
        "seconds": {"check": round(t_check, 2), "write": round(t_write, 2)},
    }
    atomic_write_json(report, out.with_suffix(".json"))
    return report


def validate_options(opts: dict) -> Convert:
    """The convert section checked against the schema (key and allowed values on error), typed."""
    from pipeline.dag.config import ConfigError, load_schema, section, validate_schema

    try:
        validate_schema(opts, load_schema()["properties"]["convert"], prefix="convert")
    except ConfigError as err:
        raise ConversionError(str(err)) from None
    return section("convert", opts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="imagefolder", choices=KINDS, help="dataset layout (pipeline.data.sources)")
    ap.add_argument(
        "--root",
        required=True,
        help="imagefolder/unlabeled: the split's folder; cifar10/cifar100/stl10: torchvision's root",
    )
    ap.add_argument(
        "--split",
        default=None,
        help="split name (default: the output's stem); "
        "cifar: train | val; stl10: train | val | unlabeled | train+unlabeled",
    )
    ap.add_argument("--out", required=True, help="output .beton path (report written next to it)")
    ap.add_argument("--config", default="{}", help="JSON with keys of the convert section")
    ap.add_argument("--strict", action="store_true", help="fail on the first unreadable image")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="check the images and write only the report (torchvision loader without FFCV)",
    )
    args = ap.parse_args(argv)
    try:
        opts = validate_options(json.loads(args.config))
        if args.strict:
            opts = dataclasses.replace(opts, strict=True)
        report = run(args.root, args.out, opts, source=args.source, split=args.split, beton=not args.report_only)
    except ConversionError as err:
        raise SystemExit(f"[convert] error: {err}") from None
    log(
        f"{report['num_samples']} images, {len(report['classes'])} classes, {len(report['skipped'])} skipped, "
        f"{len(report['ignored'])} ignored -> {args.out} ({report['bytes'] / 1e6:.1f} MB, "
        f"{report['options']['write_mode']})"
    )


if __name__ == "__main__":
    main()
