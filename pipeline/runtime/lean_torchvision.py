"""torchvision imported without torch._dynamo, which the detection stage never runs.

torchvision 0.29's ``ops.roi_align`` imports ``is_compile_supported`` from ``torch._dynamo.utils``
at module level, and ``import torchvision`` imports ``ops``: ~1 s of CPU (2 s loaded) in every
detection job, for a function roi_align calls only when torchvision's C++ ops are missing. While
torchvision is imported, ``torch._dynamo.utils`` is a stand-in whose ``is_compile_supported``
imports the real one when called; the stand-in is gone when the import returns, so that a
later ``import torch._dynamo`` is the real one. Import torchvision through ``load()`` first,
and its transforms v2 through ``transforms_v2()``: their ``tv_tensors`` decorate a function with
``torch.compiler.disable`` at import, which imports torch._dynamo too.
"""

from __future__ import annotations

import functools
import sys
import types
from importlib.metadata import version

_DYNAMO_UTILS = "torch._dynamo.utils"
# the torchvision the stand-ins were written against (requirements.txt pins 0.29.1)
TORCHVISION = "0.29"


def load() -> types.ModuleType:
    """Import torchvision once per process (as above) and return it."""
    if "torchvision" not in sys.modules and _DYNAMO_UTILS not in sys.modules:
        check_torchvision(version("torchvision"))
        stand_in = types.ModuleType(_DYNAMO_UTILS)
        stand_in.is_compile_supported = _is_compile_supported  # type: ignore[attr-defined]
        sys.modules[_DYNAMO_UTILS] = stand_in
        try:
            import torchvision  # noqa: F401
        finally:
            del sys.modules[_DYNAMO_UTILS]
    import torchvision

    return torchvision


def transforms_v2() -> types.ModuleType:
    """``torchvision.transforms.v2`` without torch._dynamo: while ``tv_tensors`` is imported,
    ``torch.compiler.disable`` defers to the decorated function's first call."""
    load()
    if "torchvision.tv_tensors" not in sys.modules and "torch._dynamo" not in sys.modules:
        import torch.compiler

        real = torch.compiler.disable
        torch.compiler.disable = _disable_on_first_call
        try:
            import torchvision.tv_tensors  # noqa: F401
        finally:
            torch.compiler.disable = real
    from torchvision.transforms import v2

    return v2


def check_torchvision(version: str) -> None:
    """Raise unless torchvision is the minor version the stand-ins were written against: another
    may import more of torch._dynamo at import time (an ImportError from the stand-in), or none
    (the stand-in unused), or decorate more with torch.compiler.disable."""
    if not version.startswith(f"{TORCHVISION}."):
        raise RuntimeError(
            f"pipeline.runtime.lean_torchvision was written for torchvision {TORCHVISION}.x, not {version}: "
            "install the versions of requirements.lock, or check its stand-ins against this torchvision "
            "(docs/performance.md lists them)"
        )


def _disable_on_first_call(fn=None, recursive=True, *, reason=None):
    """``torch.compiler.disable``, applied when ``fn`` is first called (so dynamo is imported then)."""
    if fn is None:  # @disable(recursive=..., reason=...)
        return functools.partial(_disable_on_first_call, recursive=recursive, reason=reason)
    disabled: list = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not disabled:
            import torch.compiler

            disabled.append(torch.compiler.disable(fn, recursive, reason=reason))
        return disabled[0](*args, **kwargs)

    return call


def _is_compile_supported(device_type):
    from torch._dynamo.utils import is_compile_supported

    return is_compile_supported(device_type)
