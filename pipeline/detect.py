"""Detection transfer: fine-tune a Faster R-CNN (``task: detection``) or a Mask R-CNN
(``task: segmentation``) whose backbone is the pretrained ResNet.

Heads (``head``): ``fpn`` (FPN over layer1..layer4, RoIs pooled from the pyramid) or ``c4``
(the MoCo paper's R50-C4: RPN and 14x14 RoIAlign on layer3, layer4 as the box head, then
average pooling). Every pretrained tensor comes from the checkpoint, layer4 of a C4 head
included (verified before fine-tuning). Normalisation: the backbone's (``norm``) and the new
layers' (``head_norm``, ``auto``: the backbone's kind, none under frozen BN):

- ``bn`` (the default, the MoCo paper's): the backbone's BatchNorms fine-tuned with batch
  statistics, BatchNorm in the FPN, a 4conv1fc box head and the mask head; with several ranks on
  GPUs (``ranks``, under torchrun: DDP) every BatchNorm becomes SyncBatchNorm, the paper's SyncBN;
- ``frozen_bn``: the backbone's BatchNorms become FrozenBatchNorm2d holding the pretrained
  statistics; the new layers have none (torchvision's default);
- ``gn``: GroupNorm, for a backbone pretrained with GroupNorm (``pretrain.norm: gn``), fine-tuned
  as is: independent of the (small) detection batch.

Mask R-CNN adds a mask head beside the box head: with FPN torchvision's (4 convs on 14x14 RoIs
from the pyramid, the new layers' norm), with C4 Detectron2's C4 one (the box head's res5
features, shared, then a 2x deconvolution to 14x14 masks).

All convolutions are fine-tuned. The val split is scored with pycocotools (COCO bbox AP, in
percent; with masks also segm AP, as ``mask_AP``, ``mask_AP50``, ...). Datasets:
pipeline.data.detection (the embedded scenes, COCO, Pascal VOC07+12; masks: not on VOC).
One run is one trial (``--seed``); the workflow runs ``detect.trials`` of them and reports
their mean and std. ``torchrun --nproc-per-node N -m pipeline.detect ...`` splits the batch
over N ranks; rank 0 scores the val split and writes the metrics.

    python -m pipeline.detect --config workflow/config/config.yaml \
        --checkpoint results/cells/base/pretrain/checkpoint.pt --data results/data/synthetic/det \
        --out results/cells/base/detect.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.dag.config import ConfigError, load_stage_config
from pipeline.data.detection import DetectionDataError
from pipeline.runtime import checkpoint, distributed, preempt
from pipeline.transfer import log
from pipeline.transfer.data import CocoBoxes, collate
from pipeline.transfer.evaluate import coco_evaluate, evaluate
from pipeline.transfer.metrics import AP_KEYS, MASK_KEYS
from pipeline.transfer.model import Res5Head, anchor_sizes, build_detector, pretrained_part, test_scale, verify_backbone
from pipeline.transfer.ranks import normalisation, per_rank_batch, sync_batchnorm
from pipeline.transfer.summary import summarize_trials
from pipeline.transfer.train import fine_tune_schedule, train
from pipeline.transfer.trial import run

SECTIONS = ["detect"]
# The names callers reach as pipeline.detect.<name> (the tests, from when the whole stage lived
# in this module), re-exported; new code imports them from pipeline.transfer's modules.
__all__ = [
    "AP_KEYS",
    "MASK_KEYS",
    "CocoBoxes",
    "DetectionDataError",
    "Res5Head",
    "anchor_sizes",
    "build_detector",
    "coco_evaluate",
    "collate",
    "distributed",
    "evaluate",
    "fine_tune_schedule",
    "main",
    "normalisation",
    "per_rank_batch",
    "pretrained_part",
    "run",
    "summarize_trials",
    "sync_batchnorm",
    "test_scale",
    "train",
    "verify_backbone",
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with a 'detect' section")
    ap.add_argument("--checkpoint", required=True, help="pretraining checkpoint.pt")
    ap.add_argument(
        "--data",
        required=True,
        help="COCO folder (instances_{train,val}.json + images, or the 2017 layout) or VOCdevkit (VOC2007/, VOC2012/)",
    )
    ap.add_argument("--out", required=True, help="metrics JSON")
    ap.add_argument("--seed", type=int, default=None, help="this trial's seed (default: detect.seed)")
    ap.add_argument("--state", help="resume folder, outside the outputs (default: <out without .json>.state)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
        preempt.install()
        state = Path(args.state or out.with_suffix(".state"))
        m = run(cfg, Path(args.checkpoint), Path(args.data), out, args.seed, state)
    except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, FloatingPointError) as err:
        raise SystemExit(f"[detect] error: {err}") from None
    if m is not None:
        log(f"AP={m['AP']} AP50={m['AP50']} AP75={m['AP75']} in {m['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
