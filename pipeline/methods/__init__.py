"""The pretraining methods, one folder (or module) each: its algorithm, model, heads, loss, its
own config keys, its config check, its failure rule and its registry entry together. A method's
folder registers its entry when imported; the line at the end imports each one. Adding a method:
its folder here, its name on that line and, if it has keys of its own (its keys.py), their class
among Pretrain's bases (section.py: the config's pretrain section, which the entries read)
(tests/test_method_registry.py registers a toy method from the test file alone).

Beside the methods, the parts several of them share, named for what they are: the momentum
(EMA) target and its check on the run (momentum_target.py, ema_check.py: MoCo and BYOL), InfoNCE
(info_nce.py: MoCo and SimCLR), the cross-entropy family's report and failure rule
(cross_entropy.py), their MLP heads (heads.py), split BN (split_bn.py) and gathering across
ranks (gather.py).

Standard library only (pipeline.methods.registry): a method's torch half is imported when its
model is built, so that building the DAG imports no torch.
"""

from pipeline.methods.registry import (
    CROSS_ENTROPY_METRICS,
    METHODS,
    MethodSpec,
    Metric,
    is_moco,
    method_label,
    method_spec,
    register,
    reported_metrics,
    row_order,
)

# isort: off
# each registers its entry, in the order of the schema's enum and the error messages
from pipeline.methods import moco, simclr, byol, supervised, random_init  # noqa: E402, F401
# isort: on

__all__ = [
    "CROSS_ENTROPY_METRICS",
    "METHODS",
    "MethodSpec",
    "Metric",
    "is_moco",
    "method_label",
    "method_spec",
    "register",
    "reported_metrics",
    "row_order",
]
