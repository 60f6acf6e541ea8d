"""The algorithm core: plain torch, no file or config I/O."""

from pipeline.moco.builder import MoCo
from pipeline.moco.momentum import momentum_update
from pipeline.moco.queue import KeyQueue

__all__ = ["MoCo", "KeyQueue", "momentum_update"]
