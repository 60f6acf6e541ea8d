"""FFCV imported without its fixed per-process costs. Import FFCV through ``load()`` first.

Every process that opens a loader used to pay ~10 s before its first batch on a 2-core CPU,
in every job of the workflow:

- ``import ffcv`` builds a numba typed ``Dict`` of two image modes at import time, which
  compiles numba's dict machinery (~6 s). FFCV only reads that mapping from Python, so a plain
  ``dict`` is created in its place while FFCV is imported.
- FFCV compiles each loader's pipeline with numba in every new process. ``load()`` makes
  those compilations use numba's on-disk cache: only the first job compiles. numba keys a
  cached function by its bytecode, its closure values (the pipeline's parameters), its
  signature and its source file, so a changed pipeline or a new FFCV recompiles. Functions
  that call FFCV's C library through ctypes cannot be cached (numba says "dynamic globals")
  and still compile in each process.
"""

from __future__ import annotations

import sys
import warnings

_LOADED = False
COMPILED: list = []  # dispatchers compiled through FFCV's Compiler, for the cache test and bench


def load():
    """Import ffcv once per process (as above) and return the module."""
    global _LOADED
    if not _LOADED:
        if "ffcv" not in sys.modules:
            _import_without_typed_dict()
        _cache_compilations()
        _LOADED = True
    return sys.modules["ffcv"]


def _import_without_typed_dict() -> None:
    import numba.typed

    typed_dict = numba.typed.Dict
    numba.typed.Dict = dict  # ffcv.fields.rgb_image: IMAGE_MODES = Dict(), read from Python only
    try:
        import ffcv  # noqa: F401
    finally:
        numba.typed.Dict = typed_dict


def _cache_compilations() -> None:
    from ffcv.pipeline.compiler import Compiler
    from numba import njit
    from numba.core.errors import NumbaWarning

    # ctypes calls make some pipeline functions uncacheable; that is expected, not a user error
    warnings.filterwarnings("ignore", message="Cannot cache compiled function", category=NumbaWarning)

    def compile_cached(code, signature=None):
        if not Compiler.is_enabled:
            return code
        parallel = getattr(code, "is_parallel", False) and Compiler.num_threads > 1
        dispatcher = njit(signature, fastmath=True, nogil=True, error_model="numpy", parallel=parallel, cache=True)(
            code
        )
        COMPILED.append(dispatcher)
        return dispatcher

    Compiler.compile = staticmethod(compile_cached)


def cache_stats() -> dict:
    """Cache hits and misses of the pipeline functions compiled in this process so far."""
    hits = sum(sum(d.stats.cache_hits.values()) for d in COMPILED)
    misses = sum(sum(d.stats.cache_misses.values()) for d in COMPILED)
    return {"functions": len(COMPILED), "cache_hits": hits, "cache_misses": misses}
