"""The pretraining methods, one module (or folder) each: its model, heads, config check and
registry entry together. A method's module registers its entry when imported; the line at the
end imports each one. Adding a method: its module here and its name on that line
(tests/test_method_registry.py registers a toy method from the test file alone).

Standard library only (pipeline.methods.registry): a method's torch half is imported when its
model is built, so that building the DAG imports no torch.
"""

from pipeline.methods.registry import METHODS, MethodSpec, is_moco, method_label, method_spec, register, row_order

# isort: off
# each registers its entry, in the order of the schema's enum and the error messages
from pipeline.methods import moco, supervised, random_init  # noqa: E402, F401
# isort: on

__all__ = ["METHODS", "MethodSpec", "is_moco", "method_label", "method_spec", "register", "row_order"]
