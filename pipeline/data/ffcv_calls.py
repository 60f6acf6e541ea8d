"""FFCV's C functions (libffcv: decode a JPEG, resize a crop, copy) called by symbol name.

FFCV calls them through ctypes, whose function pointers numba compiles in as addresses: a
pipeline function that calls one "uses dynamic globals" and cannot go to numba's on-disk cache,
so every job compiled its decoders again (~1-3 s of CPU per process on a 2-core EPYC). Declared
here as external symbols of the loaded library, the same C functions are called with the same
arguments, and the functions that call them are cached like any other (pipeline.data.ffcv_runtime
puts these in FFCV's place; import FFCV through its ``load()`` first). Signatures: libffcv's C
source (``int64_t`` for each pointer).
"""

from __future__ import annotations

import ffcv._libffcv
import llvmlite.binding
from ffcv import libffcv as ctypes_calls
from numba import types
from numba.extending import overload

llvmlite.binding.load_library_permanently(ffcv._libffcv.__file__)  # the symbols below, for numba's linker

_I64, _U64, _U32, _U8 = types.int64, types.uint64, types.uint32, types.uint8
_RESIZE = types.ExternalFunction("resize", types.void(*[_I64] * 11))
# bool arguments passed as one byte (C's _Bool), as ctypes passes them
_IMDECODE = types.ExternalFunction(
    "imdecode", types.int32(_I64, _U64, _U32, _U32, _I64, _U32, _U32, _U32, _U32, _U32, _U32, _U8, _U8)
)
_MEMCPY = types.ExternalFunction("my_memcpy", types.uint64(_I64, _I64, _U64))


# Each C function as a Python function that calls it through ctypes (FFCV's Compiler switched
# off, tests/test_seeded_crop.py) and, compiled, by its symbol.
def _resize(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    ctypes_calls.ctypes_resize(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)


@overload(_resize)
def _resize_by_symbol(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10):
    return lambda a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10: _RESIZE(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)


def _imdecode(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12):
    return ctypes_calls.ctypes_imdecode(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12)


@overload(_imdecode)
def _imdecode_by_symbol(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12):
    return lambda a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12: _IMDECODE(
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12
    )


def _memcpy(a0, a1, a2):
    return ctypes_calls.ctypes_memcopy(a0, a1, a2)


@overload(_memcpy)
def _memcpy_by_symbol(a0, a1, a2):
    return lambda a0, a1, a2: _MEMCPY(a0, a1, a2)


def resize_crop(source, start_row, end_row, start_col, end_col, destination):
    """ffcv.libffcv.resize_crop: rows and columns of ``source`` resized into ``destination``."""
    _resize(
        0,
        source.ctypes.data,
        source.shape[0],
        source.shape[1],
        start_row,
        end_row,
        start_col,
        end_col,
        destination.ctypes.data,
        destination.shape[0],
        destination.shape[1],
    )


def imdecode(
    source,
    dst,
    source_height,
    source_width,
    crop_height=None,
    crop_width=None,
    offset_x=0,
    offset_y=0,
    scale_factor_num=1,
    scale_factor_denom=1,
    enable_crop=False,
    do_flip=False,
):
    """ffcv.libffcv.imdecode: the JPEG in ``source`` decoded into ``dst``."""
    return _imdecode(
        source.ctypes.data,
        source.size,
        source_height,
        source_width,
        dst.ctypes.data,
        crop_height,
        crop_width,
        offset_x,
        offset_y,
        scale_factor_num,
        scale_factor_denom,
        enable_crop,
        do_flip,
    )


def memcpy(source, dest):
    """ffcv.libffcv.memcpy: ``source``'s bytes into ``dest``."""
    return _memcpy(source.ctypes.data, dest.ctypes.data, source.size * source.itemsize)
