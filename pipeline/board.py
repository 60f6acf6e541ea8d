"""TensorBoard scalars of each cell's pretraining and probe, beside log.csv and probe.json:
`tensorboard --logdir results/cells` shows every cell (runs <cell>/tensorboard/<stage>)."""

from __future__ import annotations

import math
from pathlib import Path


def board_dir(cell_dir: Path, stage: str) -> Path:
    return Path(cell_dir) / "tensorboard" / stage


class Board:
    """Numeric, finite values of a row as scalars ``<stage>/<key>`` at ``step``."""

    def __init__(self, folder: Path, stage: str):
        from torch.utils.tensorboard import SummaryWriter

        self.stage = stage
        self.writer = SummaryWriter(str(folder))

    def add(self, row: dict, step: int, skip=("epoch",)) -> None:
        for key, value in row.items():
            if (
                key not in skip
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                self.writer.add_scalar(f"{self.stage}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
