"""FFCV through pipeline.data.ffcv_runtime: the same loader output, without the per-process costs
(numba's typed Dict at import; pipeline compilation repeated in every job)."""

import json
import sys

import pytest
from conftest import run

# A job as the workflow runs it: FFCV loaded through ffcv_runtime, one pipeline function of
# ours compiled by FFCV's Compiler (its closure value is the "pipeline parameter"), one
# evaluation epoch and one two-view epoch (their decoders call FFCV's C library and hold compiled
# functions as closure values); the numba cache lives in NUMBA_CACHE_DIR.
JOB = """
import json, sys
import numpy as np
from pipeline.data import ffcv_runtime
ffcv_runtime.load()
from ffcv.fields.rgb_image import IMAGE_MODES
from ffcv.pipeline.compiler import Compiler
from pipeline.data.loaders import Centre, Reading, Views, eval_loader, two_view_loader

def pipeline_op(offset):
    def shift(x):
        return x + offset
    return shift

value = float(Compiler.compile(pipeline_op(float(sys.argv[2])))(np.zeros(3))[0])
batches = eval_loader(sys.argv[1], Centre(crop_size=16), Reading(batch_size=16, workers=1))
checksum = sum(int(images.long().sum()) for images, _, _ in batches)
views = two_view_loader(sys.argv[1], Views(crop_size=16, seed=3), Reading(batch_size=16, workers=1))
checksum += sum(int(v1.long().sum()) + 3 * int(v2.long().sum()) for v1, v2, _, _ in views)
print(json.dumps({**ffcv_runtime.cache_stats(), "value": value, "checksum": checksum,
                  "image_modes": [type(IMAGE_MODES).__name__, IMAGE_MODES["jpg"], IMAGE_MODES["raw"]]}))
"""


@pytest.mark.integration
def test_later_jobs_reuse_compiled_pipelines_and_a_changed_one_recompiles(ffcv_small, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "PYTHONWARNINGS": "error::UserWarning"}

    def job(offset: float) -> dict:
        out = run([sys.executable, str(script), str(ffcv_small / "val.beton"), str(offset)], env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second, changed = job(1.0), job(1.0), job(2.0)
    assert first["image_modes"] == ["dict", 0, 1]  # FFCV's image modes, without the typed Dict
    assert first["cache_misses"] > 0
    # the second job compiles nothing: the decoders that call C and hold compiled functions too
    assert second["cache_misses"] == 0 and second["cache_hits"] > 0
    assert first["checksum"] == second["checksum"] == changed["checksum"]  # same images either way
    assert (first["value"], second["value"]) == (1.0, 1.0)
    assert changed["value"] == 2.0  # a changed pipeline is compiled anew, not served from the cache
    assert changed["cache_misses"] == 1


def test_cache_stats_sums_every_compiled_functions_hits_and_misses(monkeypatch):
    """Two compiled functions: hits 2 + 1 (two signatures) and 0; misses 1 and 3: 3 hits, 4 misses."""
    from types import SimpleNamespace

    from pipeline.data import ffcv_runtime

    def compiled(hits: dict, misses: dict):
        return SimpleNamespace(stats=SimpleNamespace(cache_hits=hits, cache_misses=misses))

    monkeypatch.setattr(ffcv_runtime, "COMPILED", [compiled({"a": 2, "b": 1}, {"a": 1}), compiled({}, {"c": 3})])
    assert ffcv_runtime.cache_stats() == {"functions": 2, "cache_hits": 3, "cache_misses": 4}


@pytest.mark.integration
def test_an_error_in_the_decoding_thread_fails_the_loader(ffcv_small, monkeypatch):
    """FFCV's own iterator would wait for the batch forever (the job hangs): ours raises the
    thread's error where the batches are consumed."""
    from ffcv.pipeline.compiler import Compiler

    from pipeline.data import ffcv_runtime, seeded_crop
    from pipeline.data.loaders import Reading, Views, two_view_loader

    def broken_crop(*args):
        raise ValueError("a crop that cannot be drawn")

    ffcv_runtime.load()
    monkeypatch.setattr(Compiler, "is_enabled", False)  # the decoder as Python, calling the crop below
    monkeypatch.setattr(seeded_crop, "crop_and_flip", broken_crop)
    loader = two_view_loader(ffcv_small / "train.beton", Views(crop_size=16), Reading(batch_size=8, workers=1))
    with pytest.raises(ffcv_runtime.DecodingThreadDied, match="a crop that cannot be drawn") as failed:
        next(iter(loader))
    assert isinstance(failed.value.__cause__, ValueError)


# One closure compiled per value given, in order; each returns an array of its value's dtype.
FILL = """
import json, sys
import numpy as np
from pipeline.data import ffcv_runtime
ffcv_runtime.load()
from ffcv.pipeline.compiler import Compiler

def filled_with(value):
    def fill(n):
        return np.full(n, value)
    return fill

out = []
for text in sys.argv[1:]:
    array = Compiler.compile(filled_with(float(text) if "." in text else int(text)))(3)
    out.append([str(array.dtype), array.tolist()])
print(json.dumps({"arrays": out, **ffcv_runtime.cache_stats()}))
"""


@pytest.mark.integration
def test_closures_compiled_in_two_processes_keep_their_own_constants_when_loaded_together(tmp_path):
    """Two jobs compile the same closure with an int and a float (each its first compilation);
    a third loads both from the cache. Each must return its own dtype: numba names a function's
    constants by a per-process count, which was equal in the two jobs."""
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}

    def job(*values: str) -> dict:
        return json.loads(run([sys.executable, str(script), *values], env=env).stdout.strip().splitlines()[-1])

    assert job("7")["arrays"] == [["int64", [7, 7, 7]]]
    assert job("2.5")["arrays"] == [["float64", [2.5, 2.5, 2.5]]]
    both = job("7", "2.5")
    assert both["cache_hits"] == 2 and both["cache_misses"] == 0  # both loaded, not compiled again
    assert both["arrays"] == [["int64", [7, 7, 7]], ["float64", [2.5, 2.5, 2.5]]]


def test_the_patches_refuse_a_numba_or_ffcv_without_what_they_replace(monkeypatch):
    """The guards fail loudly, naming what changed, instead of running FFCV half patched."""
    import importlib.metadata

    from numba.core.bytecode import FunctionIdentity
    from numba.core.caching import FunctionCache

    from pipeline.data import ffcv_runtime

    ffcv_runtime.check_numba()  # the locked numba has each internal
    ffcv = ffcv_runtime.load()
    ffcv_runtime.check_ffcv(ffcv)

    monkeypatch.delattr(FunctionIdentity, "_unique_ids")
    with pytest.raises(RuntimeError, match=r"cannot patch numba .*: it lacks FunctionIdentity._unique_ids"):
        ffcv_runtime.check_numba()
    monkeypatch.undo()
    monkeypatch.setattr(FunctionCache, "_index_key", lambda self, sig, codegen, extra: None)
    with pytest.raises(RuntimeError, match=r"lacks FunctionCache._index_key\(sig, codegen\)"):
        ffcv_runtime.check_numba()
    monkeypatch.undo()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.1.0")
    with pytest.raises(RuntimeError, match="cannot patch ffcv 1.1.0: it lacks version 1.0.2"):
        ffcv_runtime.check_ffcv(ffcv)
