"""SimCLR's own pretrain key, declared apart from its entry (the Pretrain section,
pipeline.methods.section, holds it beside the shared keys; the entry reads that section).

Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.base.keys import key


@dataclass(frozen=True, kw_only=True)
class SimclrKeys:
    """SimCLR's own pretrain keys."""

    negatives: int | None = key(
        None,
        "simclr: in-batch negatives each view keeps, drawn afresh each step (the rest masked out); "
        "null = all 2 x batch_size - 2 (the paper)",
        minimum=1,
        maximum=2**24,
    )
