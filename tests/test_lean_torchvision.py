"""torchvision imported through pipeline.runtime.lean_torchvision: without torch._dynamo, and
with nothing of the stand-in left once the import returns."""

import subprocess
import sys

CHECK = """
import sys
from pipeline.runtime import lean_torchvision
torchvision = lean_torchvision.load()
roi_align = sys.modules["torchvision.ops.roi_align"]  # (torchvision.ops.roi_align is also a function)
before = sorted(m for m in sys.modules if m.startswith("torch._dynamo"))
supported = roi_align.is_compile_supported("cpu")  # roi_align's own name for it: imports the real one
import torch._dynamo.utils as real
print(before, supported, supported == real.is_compile_supported("cpu"), hasattr(real, "counters"))
"""


def test_torchvision_loads_without_dynamo_and_its_check_imports_the_real_one_when_called():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True", "True", "True"]


def test_a_process_that_imported_dynamo_first_keeps_it():
    """torch._dynamo imported before: torchvision is imported as is, the real module untouched."""
    code = """
import sys, torch._dynamo.utils as real
from pipeline.runtime import lean_torchvision
lean_torchvision.load()
print(sys.modules["torch._dynamo.utils"] is real)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_transforms_v2_load_without_dynamo_and_their_disabled_function_works_when_called():
    """tv_tensors.wrap, decorated with torch.compiler.disable at import: imported without
    torch._dynamo, it wraps a tensor as before when called, through the real decorator (which
    marks it for dynamo), and torch.compiler.disable is torch's own again."""
    code = """
import sys, torch, torch.compiler
real_disable = torch.compiler.disable
from pipeline.runtime import lean_torchvision
v2 = lean_torchvision.transforms_v2()
from torchvision import tv_tensors
before = any(m.startswith("torch._dynamo") for m in sys.modules)
like = tv_tensors.Image(torch.zeros(1, 2, 2))
out = tv_tensors.wrap(torch.ones(1, 2, 2), like=like)
print(before, type(out).__name__, bool(out.sum() == 4), "torch._dynamo" in sys.modules)
print(torch.compiler.disable is real_disable, v2.__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "Image", "True", "True", "True", "torchvision.transforms.v2"]


def test_the_deferred_disable_takes_the_decorators_arguments():
    """@torch.compiler.disable(recursive=False) as well as @torch.compiler.disable."""
    from pipeline.runtime import lean_torchvision

    plus_one = lean_torchvision._disable_on_first_call(recursive=False)(lambda x: x + 1)
    assert plus_one(1) == 2 and plus_one(2) == 3


def test_another_torchvision_is_refused_before_its_import():
    """The version guard fails loudly, before any stand-in is put in place."""
    import pytest

    from pipeline.runtime import lean_torchvision

    lean_torchvision.check_torchvision("0.29.1")  # the locked one
    for other in ("0.30.0", "0.2.9", "1.29.0"):
        with pytest.raises(RuntimeError, match=f"written for torchvision 0.29.x, not {other}"):
            lean_torchvision.check_torchvision(other)
