"""FFCV's C functions called by symbol (pipeline.data.ffcv_calls): compiled, they compute what
FFCV's ctypes calls compute, byte for byte."""

import io

import numpy as np
from numba import njit
from PIL import Image

from pipeline.data import ffcv_runtime

ffcv_runtime.load()
from ffcv.libffcv import ctypes_imdecode, ctypes_memcopy, ctypes_resize  # noqa: E402

from pipeline.data import ffcv_calls  # noqa: E402


def picture(height=37, width=29):
    rows, cols = np.mgrid[:height, :width]
    return np.stack([rows * 7 % 256, cols * 11 % 256, (rows * cols) % 256], axis=-1).astype(np.uint8)


def test_resize_crop_by_symbol_is_ffcvs_ctypes_resize():
    source, ours, theirs = picture(), np.zeros((16, 12, 3), np.uint8), np.zeros((16, 12, 3), np.uint8)
    njit(ffcv_calls.resize_crop)(source, 3, 30, 2, 25, ours)
    ctypes_resize(0, source.ctypes.data, 37, 29, 3, 30, 2, 25, theirs.ctypes.data, 16, 12)
    assert theirs.any() and np.array_equal(ours, theirs)


def test_imdecode_by_symbol_is_ffcvs_ctypes_imdecode():
    buffer = io.BytesIO()
    Image.fromarray(picture()).save(buffer, format="JPEG", quality=80)
    jpeg = np.frombuffer(buffer.getvalue(), np.uint8)
    ours, theirs = np.zeros((37, 29, 3), np.uint8), np.zeros((37, 29, 3), np.uint8)
    h, w = np.uint32(37), np.uint32(29)
    njit(ffcv_calls.imdecode)(jpeg, ours, h, w, h, w, 0, 0, 1, 1, False, False)
    ctypes_imdecode(jpeg.ctypes.data, jpeg.size, 37, 29, theirs.ctypes.data, 37, 29, 0, 0, 1, 1, False, False)
    # a JPEG decodes near its source (off by ~10 on this busy pattern, ~100 if it were garbage),
    # and the two calls agree exactly
    assert np.abs(theirs.astype(int) - picture()).mean() < 20 and np.array_equal(ours, theirs)


def test_memcpy_by_symbol_copies_every_byte():
    source = np.arange(50, dtype=np.uint16) * 1000
    ours, theirs = np.zeros_like(source), np.zeros_like(source)
    njit(ffcv_calls.memcpy)(source, ours)
    ctypes_memcopy(source.ctypes.data, theirs.ctypes.data, source.nbytes)
    assert np.array_equal(ours, source) and np.array_equal(theirs, source)


def test_the_python_bodies_call_ctypes_as_ffcvs_do():
    """Uncompiled (FFCV's Compiler off), the same functions run through ctypes."""
    source, ours = picture(), np.zeros((8, 8, 3), np.uint8)
    ffcv_calls.resize_crop(source, 0, 37, 0, 29, ours)
    theirs = np.zeros_like(ours)
    ctypes_resize(0, source.ctypes.data, 37, 29, 0, 37, 0, 29, theirs.ctypes.data, 8, 8)
    assert theirs.any() and np.array_equal(ours, theirs)
    copied = np.zeros_like(source)
    ffcv_calls.memcpy(source, copied)
    assert np.array_equal(copied, source)
    buffer = io.BytesIO()
    Image.fromarray(source).save(buffer, format="JPEG", quality=80)
    jpeg, decoded, reference = np.frombuffer(buffer.getvalue(), np.uint8), np.zeros_like(source), np.zeros_like(source)
    ffcv_calls.imdecode(jpeg, decoded, 37, 29, 37, 29, 0, 0, 1, 1, False, False)
    ctypes_imdecode(jpeg.ctypes.data, jpeg.size, 37, 29, reference.ctypes.data, 37, 29, 0, 0, 1, 1, False, False)
    assert reference.any() and np.array_equal(decoded, reference)
