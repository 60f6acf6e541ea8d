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
