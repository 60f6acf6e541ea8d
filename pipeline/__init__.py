"""MoCo pretraining pipeline."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository: workflow/, requirements.lock
