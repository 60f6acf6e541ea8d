"""FFCV imported without its fixed per-process costs. Import FFCV through ``load()`` first.

Every process that opens a loader used to pay ~10 s before its first batch on a 2-core CPU,
in every job of the workflow:

- ``import ffcv`` builds a numba typed ``Dict`` of two image modes at import time, which
  compiles numba's dict machinery (~6 s). FFCV only reads that mapping from Python, so a plain
  ``dict`` is created in its place while FFCV is imported.
- FFCV compiles each loader's pipeline with numba in every new process. ``load()`` makes
  those compilations use numba's on-disk cache: only the first job compiles. numba keys a
  cached function by its bytecode, its closure values (the pipeline's parameters), its
  signature and its source file, so a changed pipeline or a new FFCV recompiles.
- Functions that call FFCV's C library through ctypes cannot be cached (numba says "dynamic
  globals"): every decoder compiled again in each process. ``load()`` puts the same C
  functions, called by symbol name (pipeline.data.ffcv_calls), in place of FFCV's ctypes ones.
- Closures loaded together from the cache must not share names (``_unique_ids_across_processes``).

And one thing FFCV does not do: an error in a loader's decoding thread fails the loader.
FFCV's iterator waits on that thread's queue forever, so a decoder's exception left the job
hanging, its traceback printed once far up the log.
"""

from __future__ import annotations

import hashlib
import sys
import warnings

_LOADED = False
COMPILED: list = []  # dispatchers compiled through FFCV's Compiler, for the cache test and bench
# in the cache's keys; 2: compiled with random ids (entries of 1 may share names)
KEY_VERSION = 2


# the FFCV these patches were written against (requirements.txt pins it); numba is checked by
# what they touch (check_numba), as requirements.txt allows a range of it
FFCV_VERSION = "1.0.2"


def load():
    """Import ffcv once per process (as above) and return the module."""
    global _LOADED
    if not _LOADED:
        check_numba()
        if "ffcv" not in sys.modules:
            _import_without_typed_dict()
        check_ffcv(sys.modules["ffcv"])
        _unique_ids_across_processes()
        _cache_compilations()
        _call_c_by_symbol()
        _fail_when_the_decoding_thread_dies()
        _LOADED = True
    return sys.modules["ffcv"]


def check_numba() -> None:
    """Raise unless numba still has each internal the patches replace or read: a patch that missed
    would run FFCV unpatched, or (the ids, the cache keys) load one pipeline's code for another."""
    import numba.typed
    from numba.core.bytecode import FunctionIdentity
    from numba.core.caching import FunctionCache
    from numba.core.dispatcher import Dispatcher

    missing = [
        name
        for name, there in (
            ("numba.typed.Dict", hasattr(numba.typed, "Dict")),
            ("FunctionIdentity._unique_ids", hasattr(FunctionIdentity, "_unique_ids")),
            ("FunctionCache._index_key(sig, codegen)", _takes(FunctionCache, "_index_key", ["self", "sig", "codegen"])),
            ("Dispatcher._set_uuid", hasattr(Dispatcher, "_set_uuid")),
        )
        if not there
    ]
    _refuse("numba", numba.__version__, missing)


def check_ffcv(ffcv) -> None:
    """Raise unless this is the FFCV the patches were written against, with what they replace."""
    from importlib.metadata import version

    from ffcv.loader import loader
    from ffcv.pipeline.compiler import Compiler

    installed = version("ffcv")  # its distribution's: ffcv 1.0.2's __version__ still says 0.0.3rc1
    missing = [] if installed == FFCV_VERSION else [f"version {FFCV_VERSION}"]
    missing += [f"ffcv.libffcv.{n}" for n in ("imdecode", "resize_crop", "memcpy") if not hasattr(ffcv.libffcv, n)]
    missing += [] if hasattr(Compiler, "compile") else ["Compiler.compile"]
    missing += [] if hasattr(loader, "EpochIterator") else ["ffcv.loader.loader.EpochIterator"]
    _refuse("ffcv", installed, missing)


def _takes(cls, name: str, parameters: list[str]) -> bool:
    import inspect

    return hasattr(cls, name) and list(inspect.signature(getattr(cls, name)).parameters) == parameters


def _refuse(library: str, version: str, missing: list[str]) -> None:
    if missing:
        raise RuntimeError(
            f"pipeline.data.ffcv_runtime cannot patch {library} {version}: it lacks {', '.join(missing)}. "
            "Install the versions of requirements.lock, or adapt the patches (docs/performance.md lists them)."
        )


def _import_without_typed_dict() -> None:
    import numba.typed

    typed_dict = numba.typed.Dict
    numba.typed.Dict = dict  # ffcv.fields.rgb_image: IMAGE_MODES = Dict(), read from Python only
    try:
        import ffcv  # noqa: F401
    finally:
        numba.typed.Dict = typed_dict


def _unique_ids_across_processes() -> None:
    """Draw the id numba gives each compilation at random, not from a per-process count.

    numba names a compiled function and its environment (its Python constants, such as the
    dtype of an array it returns) by module, name, signature and that id. Two closures of one
    function with different closure values, compiled in two processes at the same count and
    loaded from the cache into a third, got one name there: the second used the first's
    constants (its float64 array came back as int64) and, once the first was collected, a
    dangling one (FFCV's decoding thread died in numba's array boxing): numba#10486,
    https://github.com/numba/numba/issues/10486.
    Random ids also differ between processes forked from one parent, which a count would not."""
    import secrets

    from numba.core.bytecode import FunctionIdentity

    class RandomIds:  # what numba asks of its counter: next()
        def __next__(self) -> int:
            return secrets.randbits(64)

    FunctionIdentity._unique_ids = RandomIds()  # type: ignore[assignment]


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
        _key_by_content(dispatcher)
        COMPILED.append(dispatcher)
        return dispatcher

    Compiler.compile = staticmethod(compile_cached)


def _key_by_content(dispatcher) -> None:
    """Key a compiled closure in numba's cache by what it computes, not by ids drawn per process.

    numba keys a cached closure by its pickled closure values. A compiled function among them
    pickles with an id drawn at random in each process (and with its signatures, whose pickle
    differs between a fresh compile and a cache load): FFCV's decoders, which hold the memory
    reader and the C calls as closure values, missed the cache in every job and added an entry
    to it. Here a compiled function is named by its content (code, closure, options, what it
    calls), and the closures that hold one are keyed through those names."""
    import types

    _content_id(dispatcher)
    dispatcher._cache._index_key = types.MethodType(_index_key, dispatcher._cache)


def _index_key(cache, sig, codegen):
    """numba's FunctionCache._index_key with the closure values as _closure_bytes gives them."""
    func = cache._py_func
    code = hashlib.sha256(func.__code__.co_code).hexdigest()
    return (sig, codegen.magic_tuple(), (code, _closure_bytes(func).hex(), KEY_VERSION))


def _closure_bytes(func) -> bytes:
    from numba.core import serialize
    from numba.core.registry import CPUDispatcher

    values = [cell.cell_contents for cell in func.__closure__ or ()]
    return _digest(_content_id(v).encode() if isinstance(v, CPUDispatcher) else serialize.dumps(v) for v in values)


def _content_id(dispatcher) -> str:
    """The dispatcher's id (numba's uuid), set from its content the first time it is asked for."""
    from numba.core.registry import CPUDispatcher

    if dispatcher._MemoMixin__uuid is None:
        func = dispatcher.py_func
        called = [func.__globals__.get(name) for name in func.__code__.co_names]
        content = [f"{func.__module__}.{func.__qualname__}".encode(), func.__code__.co_code, _closure_bytes(func)]
        content += [_content_id(f).encode() for f in called if isinstance(f, CPUDispatcher)]
        content.append(repr(sorted(dispatcher.targetoptions.items())).encode())
        dispatcher._set_uuid(_digest(content).hex())
    return dispatcher._MemoMixin__uuid


def _digest(parts) -> bytes:
    """One sha256 over the sha256 of each part (so that no two lists of parts join alike)."""
    return hashlib.sha256(b"".join(hashlib.sha256(part).digest() for part in parts)).digest()


def _call_c_by_symbol() -> None:
    import ffcv.fields.rgb_image
    import ffcv.libffcv

    from pipeline.data import ffcv_calls

    for module in (ffcv.libffcv, ffcv.fields.rgb_image):  # rgb_image took its own references at import
        for name in ("imdecode", "resize_crop", "memcpy"):
            setattr(module, name, getattr(ffcv_calls, name))


class DecodingThreadDied(RuntimeError):
    """A loader's decoding thread stopped before the epoch's last batch."""


def _fail_when_the_decoding_thread_dies() -> None:
    import ffcv.loader.loader
    from ffcv.loader.epoch_iterator import EpochIterator

    class WatchedEpochIterator(EpochIterator):
        """FFCV's epoch iterator (a thread that decodes batches into a queue) whose consumer
        raises the thread's error instead of waiting for a batch that will never come."""

        error: BaseException | None = None

        def run(self):
            try:
                super().run()
            except BaseException as err:  # raised again where the batches are consumed
                self.error = err

        def __next__(self):
            batches = self.output_queue
            with batches.not_empty:  # woken by each put; the thread's end is checked each second
                while not batches.queue:
                    if not self.is_alive():
                        raise DecodingThreadDied(
                            f"FFCV's decoding thread stopped before the epoch's end: {self.error!r}"
                        ) from self.error
                    batches.not_empty.wait(timeout=1.0)
            return super().__next__()  # the batch is there: FFCV's own hand-over

    ffcv.loader.loader.EpochIterator = WatchedEpochIterator  # the Loader's __iter__ builds this one


def cache_stats() -> dict:
    """Cache hits and misses of the pipeline functions compiled in this process so far."""
    hits = sum(sum(d.stats.cache_hits.values()) for d in COMPILED)
    misses = sum(sum(d.stats.cache_misses.values()) for d in COMPILED)
    return {"functions": len(COMPILED), "cache_hits": hits, "cache_misses": misses}
