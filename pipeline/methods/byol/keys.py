"""BYOL's own pretrain key, declared apart from its entry (the Pretrain section,
pipeline.methods.section, holds it beside the shared keys; the entry reads that section).

Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.base.keys import key


@dataclass(frozen=True, kw_only=True)
class ByolKeys:
    """BYOL's own pretrain keys."""

    predictor: bool = key(True, "byol: the online predictor; false = the ablation without it (BYOL's collapse)")
