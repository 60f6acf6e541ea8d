"""Switches the package's patches of other libraries off, for bench/patch_savings.sh: each name in
$MOCO_UNPATCH puts the plain library call back in every process started with this folder first on
PYTHONPATH (Snakemake and its jobs), so that a patch's saving is measured on real runs. Never
used by the product or the tests.

    typed_dict        FFCV imported as it is: its import compiles numba's typed Dict
    ffcv_cache        FFCV's pipelines compiled in every process: no on-disk cache, FFCV's own
                      ctypes calls, numba's per-process ids
    lean_torchvision  torchvision (and its transforms v2) imported as they are: with torch._dynamo
"""

import importlib
import os

UNPATCH = set(filter(None, os.environ.get("MOCO_UNPATCH", "").split(",")))
KNOWN = {"typed_dict", "ffcv_cache", "lean_torchvision"}
if UNPATCH - KNOWN:
    raise SystemExit(f"MOCO_UNPATCH: unknown {sorted(UNPATCH - KNOWN)} (known: {sorted(KNOWN)})")

if UNPATCH & {"typed_dict", "ffcv_cache"}:
    from pipeline.data import ffcv_runtime  # standard library only until load() is called

    if "typed_dict" in UNPATCH:
        ffcv_runtime._import_without_typed_dict = lambda: importlib.import_module("ffcv")
    if "ffcv_cache" in UNPATCH:
        for part in ("_cache_compilations", "_call_c_by_symbol", "_unique_ids_across_processes"):
            setattr(ffcv_runtime, part, lambda: None)

if "lean_torchvision" in UNPATCH:
    from pipeline.runtime import lean_torchvision

    lean_torchvision.load = lambda: importlib.import_module("torchvision")
    lean_torchvision.transforms_v2 = lambda: importlib.import_module("torchvision.transforms.v2")
