"""The random-init baseline: the backbone as initialised from the cell's seed, never trained
(pipeline.pretrain stores it); what every learnt feature is measured against."""

from pipeline.methods.registry import MethodSpec, register

ENTRY = register(MethodSpec("random", "random init", 30, build=None, trains=False))
