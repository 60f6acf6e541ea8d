"""A cell's output files as typed records: what the tables read of each (pipeline.base.layout.cell_file
names them). The only place that knows their JSON keys: a record lacking a newer key (written
before it existed) takes the field's default; keys a record does not declare are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from pipeline.base.layout import cell_file

# the last epoch's queue diagnostics (pipeline.methods.moco.staleness), read from summary.json "final"
QUEUE_METRICS = ["queue_age_p99", "queue_age_max", "negative_drift_mean", "negative_drift_max"]
DETECTION_KEYS = ["AP50", "AP", "AP75", "APs", "APm", "APl"]
TRANSFER_KEYS = DETECTION_KEYS + [f"mask_{k}" for k in DETECTION_KEYS]  # a detect.json's AP keys

R = TypeVar("R")


def read_json(path: Path) -> dict | None:
    """A JSON object from ``path``; None when it is missing or not (yet) whole."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def from_json(cls: type[R], data: dict | None) -> R | None:
    """``data`` as a ``cls`` record: the fields it has; None when there is no data."""
    if not data:
        return None
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # cls: a dataclass
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class LastEpoch:
    """summary.json "final": the last row of the pretraining log."""

    loss: float | None = None
    inst_acc: float | None = None
    drift: float | str | None = None  # ||θk − θq|| / ||θq||; "" where the method has no key encoder
    queue_age_p99: float | None = None
    queue_age_max: float | None = None
    negative_drift_mean: float | None = None
    negative_drift_max: float | None = None

    @property
    def drift_percent(self) -> float | None:
        return None if self.drift is None or self.drift == "" else 100 * float(self.drift)

    def queue(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in QUEUE_METRICS}


@dataclass(frozen=True)
class Summary:
    """summary.json of a pretraining."""

    diverged: bool = False
    failure: str | None = None  # collapsed or diverged (pipeline.pretrain), None when it trained
    final: dict | None = None
    epochs_run: int | None = None
    bn_guard: str | None = None
    key_encoder: dict | None = None
    provenance: dict | None = None

    @property
    def failed(self) -> str | None:
        """Why the run failed, or None."""
        return self.failure or ("diverged" if self.diverged else None)

    @property
    def last_epoch(self) -> LastEpoch:
        return from_json(LastEpoch, self.final) or LastEpoch()


@dataclass(frozen=True)
class ProbeRecord:
    """probe.json: the linear probe's and kNN's results."""

    mode: str | None = None
    top1: float | None = None
    top5: float | None = None
    knn_top1: float | None = None
    config: dict | None = None
    provenance: dict | None = None

    @property
    def probe_config(self) -> dict | None:
        """The probe section it ran with, as its job stated it."""
        return (self.config or {}).get("probe")


@dataclass(frozen=True)
class DetectRecord:
    """detect.json: one detection fine-tuning, or a cell's trials and their mean."""

    AP50: float | None = None
    AP: float | None = None
    AP75: float | None = None
    APs: float | None = None
    APm: float | None = None
    APl: float | None = None
    mask_AP50: float | None = None
    mask_AP: float | None = None
    mask_AP75: float | None = None
    mask_APs: float | None = None
    mask_APm: float | None = None
    mask_APl: float | None = None
    trials: list | None = None
    normalisation: str | None = None
    norm: str | None = None
    sync_bn: bool | None = None
    protocol: str | None = None
    config: dict | None = None

    def metric(self, key: str) -> float | None:
        return getattr(self, key)

    def each_trial(self) -> list[DetectRecord]:
        """Each fine-tuning trial (a record without trials is one)."""
        found = [from_json(DetectRecord, t) for t in self.trials or []]
        return [t for t in found if t is not None] or [self]

    @property
    def setup(self) -> str | None:
        """Normalisation and batch of the fine-tuning (records written before it was stored: the
        norm and the batch of the config they record)."""
        if self.normalisation:
            return self.normalisation
        batch = ((self.config or {}).get("detect") or {}).get("batch_size")
        norm = self.norm and f"{self.norm}{' (SyncBN)' if self.sync_bn else ''}"
        return norm and norm + (f", batch {batch}" if batch else "")

    @property
    def scored_as(self) -> str:
        """How it was scored; records without it predate the VOC metric: pycocotools."""
        return self.protocol or "COCO box AP (pycocotools)"


@dataclass(frozen=True)
class CellConfig:
    """config.json: the sections a cell's pretraining ran with, as its job stated them."""

    pretrain: dict | None = None


@dataclass(frozen=True)
class ConversionReport:
    """The conversion's train.json (pipeline.convert)."""

    source: str = "?"
    num_samples: int | str = "?"
    classes: list = field(default_factory=list)


@dataclass(frozen=True)
class CellOutputs:
    """Every record a cell has written so far (None: not yet)."""

    config: CellConfig | None
    summary: Summary | None
    probe: ProbeRecord | None
    detect: DetectRecord | None

    @property
    def stated_pretrain(self) -> dict | None:
        """The pretrain section the cell ran with, as its config stated it."""
        return self.config.pretrain if self.config else None

    @classmethod
    def read(cls, results: Path, cell: str, protocol: str | None = None) -> CellOutputs:
        """``protocol``: the detection metrics of that detect.protocols entry instead of detect's own."""

        def record(kind: type[R], what: str) -> R | None:
            return from_json(kind, read_json(Path(cell_file(results, cell, what).format(protocol=protocol))))

        return cls(
            record(CellConfig, "config"),
            record(Summary, "summary"),
            record(ProbeRecord, "probe"),
            record(DetectRecord, "protocol" if protocol else "detect"),
        )
