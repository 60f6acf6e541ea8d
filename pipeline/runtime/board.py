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
        self.earlier = sorted(Path(folder).glob("events.out.tfevents.*"))  # before this writer's
        self.writer = SummaryWriter(str(folder))

    def drop_earlier_runs(self) -> int:
        """Remove the event files written before this board opened: a run that starts fresh
        (not resumed) owns its folder; TensorBoard would draw an earlier run's curve as its
        own. Returns how many were removed."""
        for path in self.earlier:
            path.unlink(missing_ok=True)
        return len(self.earlier)

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
