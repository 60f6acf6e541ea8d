"""Detection transfer: fine-tune a Faster R-CNN (FPN) whose backbone is the pretrained ResNet.

Every backbone tensor comes from the checkpoint (verified before fine-tuning); with
``norm: frozen_bn`` its BatchNorms become FrozenBatchNorm2d holding the pretrained statistics,
with ``norm: bn`` they stay trainable. All convolutions are fine-tuned. The val split is scored
with pycocotools (COCO bbox AP, in percent).

    python -m pipeline.detect --config workflow/config/config.yaml \
        --checkpoint results/cells/base/pretrain/checkpoint.pt --data results/data/synthetic/det \
        --out results/cells/base/detect.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time
from pathlib import Path

import torch
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.ops import FrozenBatchNorm2d
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.transforms.functional import pil_to_tensor
from tqdm import tqdm

from pipeline import checkpoint
from pipeline.augment import MEAN, STD
from pipeline.config import DEFAULT_CONFIG, ConfigError, load_stage_config, load_yaml
from pipeline.io import atomic_write_json
from pipeline.models import build_backbone

SECTIONS = ["detect"]
AP_KEYS = ["AP", "AP50", "AP75", "APs", "APm", "APl"]  # the order of COCOeval.stats
# One anchor size per pyramid level (layer1..layer4, pool), as fractions of the image side:
# a x1.5 ladder from 1/8 to ~2/3 covers the 15-46 px shapes of 96 px scenes (IoU >= 0.6 when centred).
ANCHOR_FRACTIONS = (0.125, 0.1875, 0.28125, 0.421875, 0.6328125)
BOX_HEAD_DIM = 256  # torchvision's 1024 triples the cost on CPU for no gain on 10 classes


def log(msg: str) -> None:
    tqdm.write(f"[detect] {msg}", file=sys.stdout)  # clears and redraws a progress bar on stderr


class CocoBoxes(torch.utils.data.Dataset):
    """COCO json + images -> (float [0,1] CHW image, {boxes xyxy, labels, image_id})."""

    def __init__(self, ann_path: Path, image_root: Path, flip: bool = False):
        if not ann_path.is_file():
            raise FileNotFoundError(f"annotation file not found: {ann_path}")
        data = json.loads(ann_path.read_text())
        self.images, self.root, self.flip = data["images"], image_root, flip
        self.categories = data["categories"]
        self.anns = {img["id"]: [] for img in self.images}
        for ann in data["annotations"]:
            w, h = ann["bbox"][2:]
            if not ann.get("iscrowd", 0) and w > 0 and h > 0:  # torchvision rejects empty boxes
                self.anns[ann["image_id"]].append(ann)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        info = self.images[i]
        image = pil_to_tensor(Image.open(self.root / info["file_name"]).convert("RGB")).float() / 255
        anns = self.anns[info["id"]]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        if self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
            boxes[:, [0, 2]] = image.shape[-1] - boxes[:, [2, 0]]
        labels = torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)
        return image, {"boxes": boxes, "labels": labels, "image_id": info["id"]}


def collate(batch):
    return tuple(zip(*batch))


def freeze_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm2d by a FrozenBatchNorm2d holding its statistics and affine."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps)
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(frozen, key).copy_(getattr(child, key).detach())
            setattr(module, name, frozen)
        else:
            freeze_batchnorm(child)
    return module


def build_detector(ckpt: dict, dc: dict, num_classes: int, source: str = "checkpoint") -> FasterRCNN:
    """Faster R-CNN + FPN over layer1..layer4 of the checkpoint's backbone (all weights loaded)."""
    backbone = build_backbone(ckpt["arch"])
    checkpoint.load_backbone_state(backbone, ckpt["backbone"], source)
    if dc["norm"] == "frozen_bn":
        freeze_batchnorm(backbone)
    channels, size = dc["fpn_channels"], dc["image_size"]
    body = BackboneWithFPN(backbone, {f"layer{k}": str(k - 1) for k in range(1, 5)},
                           backbone.stage_channels, channels, extra_blocks=LastLevelMaxPool())
    sizes = tuple((max(2, round(size * f)),) for f in ANCHOR_FRACTIONS)
    anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
    head = TwoMLPHead(channels * 7 * 7, BOX_HEAD_DIM)
    # Scenes hold 2-4 objects: a few hundred proposals and 128 sampled RoIs are plenty.
    return FasterRCNN(body, rpn_anchor_generator=anchors, box_head=head,
                      box_predictor=FastRCNNPredictor(BOX_HEAD_DIM, num_classes),
                      min_size=size, max_size=size, image_mean=MEAN, image_std=STD,
                      rpn_pre_nms_top_n_train=1000, rpn_post_nms_top_n_train=300,
                      rpn_pre_nms_top_n_test=500, rpn_post_nms_top_n_test=150, box_batch_size_per_image=128)


def verify_backbone(detector: FasterRCNN, state: dict, source: str = "checkpoint") -> None:
    """Raise CheckpointError unless every backbone tensor of the detector equals the checkpoint's."""
    own = detector.backbone.body.state_dict()
    # FrozenBatchNorm2d has no step counter; every other tensor must be present and equal.
    missing = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]
    differ = [k for k in state if k in own and not torch.equal(own[k], state[k].to(own[k].dtype))]
    if missing or differ:
        raise checkpoint.CheckpointError(
            f"{source}: detector backbone does not hold the pretrained weights: "
            f"missing {missing[:5]}, different {differ[:5]}")


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train(detector: FasterRCNN, loader, dc: dict) -> list[float]:
    """Fine-tune everything trainable; returns the mean loss of each epoch."""
    params = [p for p in detector.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=dc["lr"], momentum=0.9, weight_decay=dc["weight_decay"])
    epochs, total = dc["epochs"], dc["epochs"] * len(loader)
    warmup = max(1, min(100, total // 4))  # random heads give huge first gradients (NaN at 2x lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    curve, bar = [], tqdm(total=total, desc="[detect] train", file=sys.stderr, mininterval=5, leave=False)
    detector.train()
    for epoch in range(epochs):
        start, losses = time.time(), []
        for step, (images, targets) in enumerate(loader):
            loss = sum(detector(list(images), list(targets)).values())
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss is not finite at epoch {epoch + 1} step {step + 1}; "
                                         f"lower detect.lr (now {dc['lr']})")
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            bar.update()
        curve.append(round(sum(losses) / len(losses), 5))
        log(f"epoch {epoch + 1}/{epochs} loss {curve[-1]:.4f} lr {opt.param_groups[0]['lr']:.5f} "
            f"({time.time() - start:.1f} s)")
    bar.close()
    return curve


@torch.no_grad()
def predict(detector: FasterRCNN, dataset: CocoBoxes, batch_size: int) -> list[dict]:
    """Detections on a dataset, in COCO results format (boxes in original image pixels)."""
    detector.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    results = []
    for images, targets in loader:
        for out, target in zip(detector(list(images)), targets):
            for (x0, y0, x1, y1), label, score in zip(out["boxes"].tolist(), out["labels"].tolist(),
                                                      out["scores"].tolist()):
                results.append({"image_id": target["image_id"], "category_id": label,
                                "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                                "score": round(score, 5)})
    return results


def load_coco(path: str | Path) -> COCO:
    if not Path(path).is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress chatter
        return COCO(str(path))


def coco_evaluate(gt: str | Path | COCO, detections: list[dict]) -> dict:
    """COCO bbox AP, AP50, AP75, APs, APm, APl in percent (None: no ground truth of that size)."""
    coco_gt = gt if isinstance(gt, COCO) else load_coco(gt)
    with contextlib.redirect_stdout(io.StringIO()):
        if detections:
            coco_dt = coco_gt.loadRes(detections)
        else:  # loadRes rejects an empty list: evaluate against an empty result set instead
            coco_dt = COCO()
            coco_dt.dataset = {"images": coco_gt.dataset["images"], "annotations": [],
                               "categories": coco_gt.dataset["categories"]}
            coco_dt.createIndex()
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    metrics = {k: round(100 * float(v), 3) if v >= 0 else None for k, v in zip(AP_KEYS, evaluator.stats)}
    log("COCO bbox " + " ".join(f"{k}={v}" for k, v in metrics.items()) + f" ({len(detections)} detections)")
    return metrics


def run(cfg: dict, ckpt_path: Path, data_dir: Path, out: Path) -> dict:
    """Fine-tune on the train split, score the val split, write the metrics JSON to ``out``."""
    dc = {**load_yaml(DEFAULT_CONFIG)["detect"], **cfg["detect"]}  # unset keys: the workflow defaults
    cfg = {**cfg, "detect": dc}
    torch.manual_seed(dc["seed"])
    torch.set_num_threads(dc["threads"])
    ckpt = checkpoint.load(ckpt_path)
    train_set = CocoBoxes(data_dir / "instances_train.json", data_dir, flip=True)
    val_set = CocoBoxes(data_dir / "instances_val.json", data_dir)
    num_classes = max(c["id"] for c in train_set.categories) + 1  # label 0 is background
    detector = build_detector(ckpt, dc, num_classes, str(ckpt_path))
    verify_backbone(detector, ckpt["backbone"], str(ckpt_path))
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=dc["batch_size"], shuffle=True, collate_fn=collate,
        drop_last=len(train_set) > dc["batch_size"],  # equal-sized steps, unless one batch is all there is
        generator=torch.Generator().manual_seed(dc["seed"]))
    log(f"{len(train_set)} train / {len(val_set)} val images, {num_classes - 1} classes, "
        f"{ckpt['arch']}, norm {dc['norm']}")
    start = time.time()
    curve = train(detector, loader, dc)
    metrics = coco_evaluate(data_dir / "instances_val.json", predict(detector, val_set, dc["batch_size"]))
    metrics.update({"epochs": dc["epochs"], "train_loss": curve, "seconds": round(time.time() - start, 1),
                    "arch": ckpt["arch"], "method": ckpt.get("method"), "norm": dc["norm"],
                    "checkpoint": str(ckpt_path), "num_train_images": len(train_set),
                    "num_val_images": len(val_set), "config": cfg})
    atomic_write_json(metrics, out)
    return metrics


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="inline JSON or a YAML file with a 'detect' section")
    ap.add_argument("--checkpoint", required=True, help="pretraining checkpoint.pt")
    ap.add_argument("--data", required=True, help="folder with instances_{train,val}.json and the images")
    ap.add_argument("--out", required=True, help="metrics JSON")
    args = ap.parse_args(argv)
    try:
        cfg = load_stage_config(args.config, SECTIONS)
        m = run(cfg, Path(args.checkpoint), Path(args.data), Path(args.out))
    except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, FloatingPointError) as err:
        raise SystemExit(f"[detect] error: {err}")
    log(f"AP={m['AP']} AP50={m['AP50']} AP75={m['AP75']} in {m['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
