"""Detection transfer: fine-tune a Faster R-CNN (``task: detection``) or a Mask R-CNN
(``task: segmentation``) whose backbone is the pretrained ResNet.

Heads (``head``): ``fpn`` (FPN over layer1..layer4, RoIs pooled from the pyramid) or ``c4``
(the MoCo paper's R50-C4: RPN and 14x14 RoIAlign on layer3, layer4 as the box head, then
average pooling). Every pretrained tensor comes from the checkpoint, layer4 of a C4 head
included (verified before fine-tuning). Normalisation (``norm``):

- ``frozen_bn``: the backbone's BatchNorms become FrozenBatchNorm2d holding the pretrained
  statistics; the new layers (FPN, box head) have none (torchvision's default);
- ``bn``: the backbone's BatchNorms are fine-tuned with batch statistics, and the new layers
  have BatchNorm too (FPN, a 4conv1fc box head); with several ranks on GPUs (``ranks``, under
  torchrun: DDP) every BatchNorm becomes SyncBatchNorm, the paper's SyncBN;
- ``gn``: GroupNorm in the new layers, for a backbone pretrained with GroupNorm
  (``pretrain.norm: gn``), fine-tuned as is: independent of the (small) detection batch.

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
import contextlib
import hashlib
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import cast

import torch
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.transforms.functional import pil_to_tensor
from tqdm import tqdm

from pipeline.dag.config import VOC_HAS_NO_MASKS, ConfigError, load_stage_config, result_part, section, to_dict
from pipeline.dag.sections import JOBS, RUNTIME, Detect
from pipeline.data.augment import MEAN, STD
from pipeline.data.detection import DetectionDataError, DetectionSplit, load_splits
from pipeline.data.loaders import sample_seed
from pipeline.eval import masks as masks_io
from pipeline.eval import voc_eval
from pipeline.nets.models import build_backbone, group_norm
from pipeline.nets.optim import Schedule
from pipeline.runtime import checkpoint, cpus, distributed, preempt
from pipeline.runtime.io import atomic_write_json
from pipeline.runtime.stage_log import stage_log
from pipeline.runtime.stopwatch import Stopwatch

SECTIONS = ["detect"]
AP_KEYS = ["AP", "AP50", "AP75", "APs", "APm", "APl"]  # the order of COCOeval.stats
MASK_KEYS = [f"mask_{k}" for k in AP_KEYS]  # segm AP, beside the box AP of AP_KEYS
# One anchor size per pyramid level (layer1..layer4, pool), as fractions of the image side:
# a x1.5 ladder from 1/8 to ~2/3 covers the 15-46 px shapes of 96 px scenes (IoU >= 0.6 when centred).
ANCHOR_FRACTIONS = (0.125, 0.1875, 0.28125, 0.421875, 0.6328125)
BOX_HEAD_DIM = 256  # torchvision's 1024 triples the cost on CPU for no gain on 10 classes
C4_MASK_DIM = 256  # channels of C4's mask deconvolution (Detectron2's ROI_MASK_HEAD.CONV_DIM)
MASK_THRESHOLD = 0.5  # a predicted mask's pixels: probability above this (torchvision's, Detectron2's)


log = stage_log("detect", when=distributed.is_main_process)


class CocoBoxes(torch.utils.data.Dataset):
    """A COCO-format split -> (float [0,1] CHW image, {boxes xyxy, labels, image_id}, and with
    ``masks`` the instance masks: uint8 NxHxW).

    Training targets leave out crowd regions, but keep VOC's difficult objects."""

    def __init__(self, split: DetectionSplit, flip: bool = False, masks: bool = False):
        self.images, self.root, self.flip, self.masks = split.coco["images"], split.image_root, flip, masks
        self.categories = split.coco["categories"]
        self.anns: dict[int, list[dict]] = {img["id"]: [] for img in self.images}
        for ann in split.coco["annotations"]:
            w, h = ann["bbox"][2:]
            crowd = ann.get("iscrowd", 0) and not ann.get("difficult", 0)
            if not crowd and w > 0 and h > 0:  # torchvision rejects empty boxes
                self.anns[ann["image_id"]].append(ann)
        if masks:
            check_masks(split)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        info = self.images[i]
        path = self.root / info["file_name"]
        if not path.is_file():
            raise DetectionDataError(f"image not found: {path}")
        image = pil_to_tensor(Image.open(path).convert("RGB")).float() / 255
        anns = self.anns[info["id"]]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        flipped = self.flip and torch.rand(()) < 0.5
        if flipped:
            image = image.flip(-1)
            boxes[:, [0, 2]] = image.shape[-1] - boxes[:, [2, 0]]
        labels = torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)
        target = {"boxes": boxes, "labels": labels, "image_id": info["id"]}
        if self.masks:
            target["masks"] = instance_masks(anns, info["height"], info["width"], bool(flipped))
        return image, target


def instance_masks(anns: list[dict], height: int, width: int, flipped: bool) -> torch.Tensor:
    """The annotations' masks as a uint8 NxHxW tensor, mirrored with the image when flipped."""
    masks = torch.zeros((len(anns), height, width), dtype=torch.uint8)
    for i, ann in enumerate(anns):
        masks[i] = torch.from_numpy(masks_io.decode(ann["segmentation"], height, width))
    return masks.flip(-1) if flipped else masks


def check_masks(split: DetectionSplit) -> None:
    """Segmentation needs every object's mask: VOC has none, a COCO file may lack some."""
    if split.kind == "voc":
        raise ConfigError(VOC_HAS_NO_MASKS)
    lacking = [a["id"] for a in split.coco["annotations"] if not a.get("segmentation")]
    if lacking:
        raise DetectionDataError(
            f"{split.name}: {len(lacking)} annotation(s) without 'segmentation' (ids {lacking[:5]}): "
            "detect.task segmentation needs every object's mask"
        )


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


class Res5Head(nn.Module):
    """The C4 box head: the pretrained layer4 on each 14x14 RoI, then global average pooling.
    With a norm, one more normalisation after layer4 (the MoCo paper's Res5ROIHeadsExtraNorm:
    it adapts the pretrained features' scale to the new task)."""

    def __init__(self, layer4: nn.Module, channels: int, norm=None):
        super().__init__()
        self.layer4 = layer4  # the attribute name keeps the checkpoint's keys (layer4.*)
        self.extra_norm = norm(channels) if norm else nn.Identity()

    def forward(self, x):
        return self.extra_norm(self.layer4(x)).mean((2, 3))


def anchor_sizes(dc: Detect) -> list[int]:
    """Anchor sides in pixels: detect.anchor_sizes, or fractions of the image side tuned for
    the embedded scenes. FPN puts one per level (layer1..layer4, pool), C4 all on layer3."""
    if dc.anchor_sizes:
        return list(dc.anchor_sizes)
    return [max(2, round(dc.image_size * f)) for f in ANCHOR_FRACTIONS]


def new_layer_norm(dc: Detect):
    """The normalisation of the layers the detector adds (FPN, box head)."""
    return {"frozen_bn": None, "bn": nn.BatchNorm2d, "gn": group_norm}[dc.norm]


def check_norm(arch: dict, dc: Detect, source: str) -> None:
    backbone_norm = arch.get("norm", "bn")  # the checkpoint's record: older ones have no norm
    if dc.norm == "gn" and backbone_norm != "gn":
        raise ConfigError(
            f"detect.norm: gn needs a backbone pretrained with GroupNorm (pretrain.norm: gn); "
            f"{source} holds a BatchNorm backbone: use frozen_bn or bn"
        )


def build_detector(ckpt: dict, dc: Detect, num_classes: int, source: str = "checkpoint") -> FasterRCNN:
    """Faster R-CNN, or Mask R-CNN for ``task: segmentation``, over the checkpoint's backbone
    (all weights loaded), FPN or C4 head. ``dc``: the detect section."""
    check_norm(ckpt["arch"], dc, source)
    backbone = build_backbone(ckpt["arch"])
    checkpoint.load_backbone_state(backbone, ckpt["backbone"], source)
    if dc.norm == "frozen_bn":
        freeze_batchnorm(backbone)
    size, norm = dc.image_size, new_layer_norm(dc)
    sizes = anchor_sizes(dc)
    stages = cast(list[int], backbone.stage_channels)  # a ResNet's channels per stage (check_norm)
    if dc.head == "c4":
        body = IntermediateLayerGetter(backbone, {"layer3": "0"})  # stem, layer1..layer3
        body.out_channels = stages[2]
        box_head = Res5Head(backbone.get_submodule("layer4"), stages[3], norm)
        parts = dict(
            rpn_anchor_generator=AnchorGenerator((tuple(sizes),), ((0.5, 1.0, 2.0),)),
            box_roi_pool=MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=0),
            box_head=box_head,
            box_predictor=FastRCNNPredictor(stages[3], num_classes),
        )
        mask_in = stages[3]  # the mask branch reads res5's output
    else:
        channels = dc.fpn_channels
        body = BackboneWithFPN(
            backbone,
            {f"layer{k}": str(k - 1) for k in range(1, 5)},
            stages,
            channels,
            extra_blocks=LastLevelMaxPool(),
            norm_layer=norm,
        )
        # With a norm the box head is 4conv1fc (torchvision's v2 and Detectron2's GN/SyncBN head).
        head = (
            TwoMLPHead(channels * 7 * 7, BOX_HEAD_DIM)
            if norm is None
            else FastRCNNConvFCHead((channels, 7, 7), [channels] * 4, [BOX_HEAD_DIM], norm_layer=norm)
        )
        parts = dict(
            rpn_anchor_generator=AnchorGenerator(tuple((s,) for s in sizes), ((0.5, 1.0, 2.0),) * len(sizes)),
            box_head=head,
            box_predictor=FastRCNNPredictor(BOX_HEAD_DIM, num_classes),
        )
        mask_in = channels  # the mask branch reads the pyramid
    # FasterRCNN would draw its RPN head here, after the box head: drawn explicitly, before any
    # mask layer, a Mask R-CNN's detection part starts from the Faster R-CNN's weights
    parts["rpn_head"] = RPNHead(body.out_channels, parts["rpn_anchor_generator"].num_anchors_per_location()[0])
    if dc.task == "segmentation":
        parts.update(mask_parts(dc, parts, mask_in, num_classes))
    rpn = dc.rpn
    # training draws each image's shorter side from train_sizes (multi-scale); test: image_size
    train_sizes = tuple(dc.train_sizes or (size,))
    model = MaskRCNN if dc.task == "segmentation" else FasterRCNN
    return model(
        body,
        min_size=train_sizes,
        max_size=dc.max_image_size or size,
        image_mean=MEAN,
        image_std=STD,
        rpn_pre_nms_top_n_train=rpn.pre_nms_train,
        rpn_post_nms_top_n_train=rpn.post_nms_train,
        rpn_pre_nms_top_n_test=rpn.pre_nms_test,
        rpn_post_nms_top_n_test=rpn.post_nms_test,
        box_batch_size_per_image=dc.roi_per_image,
        **parts,
    )


def mask_parts(dc: Detect, parts: dict, channels: int, num_classes: int) -> dict:
    """The mask branch (C4's or FPN's), drawn from a copy of the random stream: the detection
    part's weights and the training's RoI sampling then draw what a Faster R-CNN's do, so that
    the two tasks differ by the mask head and its loss alone (a paired comparison)."""
    with torch.random.fork_rng(devices=[]):
        if dc.head == "c4":
            return c4_mask_parts(parts["box_head"], channels, num_classes)
        return fpn_mask_parts(channels, num_classes, new_layer_norm(dc))


def fpn_mask_parts(channels: int, num_classes: int, norm) -> dict:
    """torchvision's FPN mask head: 14x14 RoIs from the pyramid's levels, 4 convs (with the
    new layers' norm), a 2x deconvolution to 28x28 masks."""
    return dict(
        mask_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], output_size=14, sampling_ratio=2),
        mask_head=MaskRCNNHeads(channels, [channels] * 4, 1, norm_layer=norm),
        mask_predictor=MaskRCNNPredictor(channels, channels, num_classes),
    )


def c4_mask_parts(box_head: Res5Head, channels: int, num_classes: int) -> dict:
    """Detectron2's C4 mask head: the box head's res5 (the same modules and weights) on the
    14x14 RoIs of layer3, without its pooling, then a 2x deconvolution to 14x14 masks."""
    return dict(
        mask_roi_pool=MultiScaleRoIAlign(["0"], output_size=14, sampling_ratio=0),
        mask_head=nn.Sequential(box_head.layer4, box_head.extra_norm),
        mask_predictor=MaskRCNNPredictor(channels, C4_MASK_DIM, num_classes),
    )


def test_scale(detector: FasterRCNN, dc: Detect) -> None:
    """Evaluate at image_size (torchvision would take the last training size)."""
    detector.transform.min_size = (dc.image_size,)


def pretrained_part(detector: FasterRCNN) -> dict:
    """The detector's tensors that come from the checkpoint, under the checkpoint's names."""
    c4 = isinstance(detector.roi_heads.box_head, Res5Head)  # C4: stem..layer3 in the body, layer4 in the head
    state = dict((detector.backbone if c4 else detector.backbone.body).state_dict())
    if c4:
        state.update(detector.roi_heads.box_head.state_dict())
    return state


def verify_backbone(detector: FasterRCNN, state: dict, source: str = "checkpoint") -> None:
    """Raise CheckpointError unless every backbone tensor of the detector equals the checkpoint's."""
    own = pretrained_part(detector)
    # FrozenBatchNorm2d has no step counter; every other tensor must be present and equal.
    missing = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]
    differ = [k for k in state if k in own and not torch.equal(own[k], state[k].to(own[k].dtype))]
    if missing or differ:
        raise checkpoint.CheckpointError(
            f"{source}: detector backbone does not hold the pretrained weights: "
            f"missing {missing[:5]}, different {differ[:5]}"
        )


def fine_tune_schedule(dc: Detect, total: int) -> Schedule:
    """``detect.warmup_iters`` of linear warmup (at most a quarter of the ``total`` iterations:
    random heads give huge first gradients, NaN at 2x lr), then cosine to zero, or x0.1 at each
    of ``lr_steps`` (iterations, as Detectron2's SOLVER.STEPS)."""
    warmup = max(1, min(dc.warmup_iters, total // 4))
    return Schedule(total, dc.schedule, warmup, tuple(float(s) for s in dc.lr_steps or ()))


def iterations(dc: Detect, steps_per_epoch: int) -> int:
    """Training length: detect.iterations when set (Detectron2's MAX_ITER), else epochs x steps."""
    return dc.iterations or dc.epochs * steps_per_epoch


def to_device(images, targets, device) -> tuple[list, list]:
    return (
        [im.to(device, non_blocking=True) for im in images],
        [{k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items()} for t in targets],
    )


class EpochSeeded(torch.utils.data.Dataset):
    """A dataset's items keyed (epoch, index): each one's random draws (the training flip) come
    from (seed, epoch, index) alone (pipeline.data.loaders.sample_seed), not from a process's or
    a worker's RNG stream, so that a run resumed mid-epoch draws what the uninterrupted one drew."""

    def __init__(self, dataset: torch.utils.data.Dataset, seed: int):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset

    def __getitem__(self, key: tuple[int, int]):
        epoch, i = key
        with torch.random.fork_rng(devices=[]):  # the process's own stream is left as it was
            torch.manual_seed(sample_seed(self.seed, epoch, i))
            return self.dataset[i]


class EpochOrder(torch.utils.data.Sampler):
    """This rank's share of epoch ``epoch``'s order (DistributedSampler's: shuffled from seed +
    epoch, equal shares), from sample ``start`` on (a resume), keyed for EpochSeeded."""

    def __init__(self, size: int, world_size: int, rank: int, seed: int):
        self.shard: torch.utils.data.DistributedSampler = torch.utils.data.DistributedSampler(
            range(size),  # type: ignore[arg-type]  # a sampler only needs len()
            world_size,
            rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.epoch = self.start = 0

    def __len__(self) -> int:
        return len(self.shard) - self.start

    def __iter__(self):
        self.shard.set_epoch(self.epoch)
        return iter([(self.epoch, i) for i in list(self.shard)[self.start :]])


def train(model: nn.Module, loader, dc: Detect, state: checkpoint.StageState) -> list[float]:
    """Fine-tune everything trainable (a FasterRCNN, or it wrapped in DDP); returns the mean
    loss of each epoch (this rank's). Resumes from ``state`` and saves it at epoch ends, every
    detect.checkpoint_every iterations and on a preemption signal (then exits for a requeue)."""
    detector = getattr(model, "module", model)  # DDP's: the weights saved under their own names
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=dc.lr, momentum=0.9, weight_decay=dc.weight_decay)
    steps = len(loader)  # of a whole epoch: the sampler starts at 0
    total = iterations(dc, steps)
    epochs = math.ceil(total / steps)  # the last one cut short at `total` iterations
    schedule = fine_tune_schedule(dc, total)
    epoch, step, losses, curve = 0, 0, [], []
    resumed = state.load()
    if resumed is not None:
        detector.load_state_dict(resumed["detector"])
        opt.load_state_dict(resumed["optimizer"])
        epoch, step, mine = resumed["epoch"], resumed["step_in_epoch"], resumed["rank"]
        losses, curve = list(mine["losses"]), list(mine["curve"])
        with torch.no_grad():  # this rank's own BN statistics (unsynchronised BN on CPU ranks)
            for name, buf in distributed.bn_statistics(detector).items():
                buf.copy_(mine["bn"][name])
    done = epoch * steps + step

    def save() -> None:
        bn = {k: v.cpu() for k, v in distributed.bn_statistics(detector).items()}
        state.save(
            epoch,
            step,
            {"losses": losses, "curve": curve, "bn": bn},
            detector=detector.state_dict(),
            optimizer=opt.state_dict(),
        )

    bar = tqdm(
        total=total,
        initial=done,
        desc="[detect] train",
        file=sys.stderr,
        mininterval=5,
        leave=False,
        disable=not distributed.is_main_process(),
    )
    model.train()
    while epoch < epochs:
        start = time.time()
        loader.sampler.epoch, loader.sampler.start = epoch, step * loader.batch_size
        for images, targets in loader:
            if done == total:
                break
            images, targets = to_device(images, targets, device)
            for group in opt.param_groups:
                group["lr"] = dc.lr * schedule.factor(done)
            loss = sum(model(images, targets).values())
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss is not finite at epoch {epoch + 1} step {step + 1}; lower detect.lr (now {dc.lr})"
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            bar.update()
            done, step = done + 1, step + 1
            stop = preempt.stop_agreed(done, state.env.world_size)
            if stop or state.due(done):
                save()
            if stop:
                preempt.requeue_and_exit(log)
        curve.append(round(sum(losses) / len(losses), 5))
        log(
            f"epoch {epoch + 1}/{epochs} loss {curve[-1]:.4f} lr {opt.param_groups[0]['lr']:.5f} "
            f"({time.time() - start:.1f} s)"
        )
        epoch, step, losses = epoch + 1, 0, []
        save()
    bar.close()
    return curve


def run_fingerprint(dc: Detect, ckpt_path: Path, seed: int, train_split: DetectionSplit) -> dict:
    """What determines a trial (its resume state must match): the detect section's result keys,
    the seed, the checkpoint's content and the training split's images and annotations."""
    split = {k: train_split.coco.get(k) for k in ("images", "annotations", "categories")}
    text = json.dumps(split, sort_keys=True, separators=(",", ":"))
    return {
        "detect": json.loads(json.dumps(result_part("detect", to_dict(dc), drop=(RUNTIME, JOBS)))),
        "seed": seed,
        "checkpoint sha256": checkpoint.file_digest(ckpt_path),
        "train split sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


@torch.no_grad()
def predict(detector: FasterRCNN, dataset: CocoBoxes, batch_size: int) -> list[dict]:
    """Detections on a dataset, in COCO results format (boxes in original image pixels; a
    Mask R-CNN's also with its ``segmentation``, RLE)."""
    detector.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    device, results = next(detector.parameters()).device, []
    for images, targets in loader:
        for out, target in zip(detector([im.to(device) for im in images]), targets):
            for k, ((x0, y0, x1, y1), label, score) in enumerate(
                zip(out["boxes"].tolist(), out["labels"].tolist(), out["scores"].tolist())
            ):
                result = {
                    "image_id": target["image_id"],
                    "category_id": label,
                    "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                    "score": round(score, 5),
                }
                if "masks" in out:  # N x 1 x H x W probabilities, pasted into the image
                    result["segmentation"] = masks_io.to_rle((out["masks"][k, 0] > MASK_THRESHOLD).cpu().numpy())
                results.append(result)
    return results


def coco_from_dict(data: dict) -> COCO:
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress chatter
        coco.createIndex()
    return coco


def coco_evaluate(gt: dict | str | Path, detections: list[dict], iou_type: str = "bbox") -> dict:
    """COCO AP, AP50, AP75, APs, APm, APl in percent (None: no ground truth of that size), of
    the boxes (``iou_type`` bbox) or of the masks (segm: IoU of the masks, each detection's
    ``segmentation``). ``gt``: a COCO-format dict or its JSON file. Ground truth marked iscrowd
    (crowds; VOC's difficult objects) is ignored, not missed."""
    if not isinstance(gt, dict):
        if not Path(gt).is_file():
            raise FileNotFoundError(f"annotation file not found: {gt}")
        gt = json.loads(Path(gt).read_text())
    assert isinstance(gt, dict)  # for the checker: a dict, read or given
    coco_gt = coco_from_dict(gt)
    if iou_type == "segm":  # without a box pycocotools reads a result's area and box from its mask
        detections = [{k: v for k, v in d.items() if k != "bbox"} for d in detections]
    with contextlib.redirect_stdout(io.StringIO()):
        # loadRes rejects an empty list: evaluate against an empty result set instead
        coco_dt = (
            coco_gt.loadRes(detections)
            if detections
            else coco_from_dict({"images": gt["images"], "annotations": [], "categories": gt["categories"]})
        )
        evaluator = COCOeval(coco_gt, coco_dt, iouType=iou_type)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    metrics = {k: round(100 * float(v), 3) if v >= 0 else None for k, v in zip(AP_KEYS, evaluator.stats)}
    log(f"COCO {iou_type} " + " ".join(f"{k}={v}" for k, v in metrics.items()) + f" ({len(detections)} detections)")
    return metrics


def voc_metric(split: DetectionSplit, dc: Detect) -> str:
    """auto: VOC2007's 11-point metric on a 2007 test set, the area under the curve otherwise
    (as Detectron2 picks it by the test set's year)."""
    choice = dc.voc_metric
    return choice if choice != "auto" else ("11point" if split.year == "2007" else "area")


def evaluate(split: DetectionSplit, detections: list[dict], dc: Detect) -> dict:
    """The split's own protocol: COCO box AP; on VOC, VOC's metric (AP50, AP75 and AP over IoU
    0.50:0.95, as the MoCo paper's VOC table) with the COCO-style numbers beside it."""
    coco = coco_evaluate(split.coco, detections)
    if dc.task == "segmentation":  # check_masks: not VOC
        segm = coco_evaluate(split.coco, detections, "segm")
        return {**coco, **{f"mask_{k}": v for k, v in segm.items()}, "protocol": "COCO box and mask AP (pycocotools)"}
    if split.kind != "voc":
        return {**coco, "protocol": "COCO box AP (pycocotools)"}
    metric = voc_metric(split, dc)
    voc = voc_eval.evaluate(split.coco, detections, metric)
    log(f"VOC ({metric}) AP50={voc['AP50']} AP={voc['AP']} AP75={voc['AP75']}")
    return {
        "AP": voc["AP"],
        "AP50": voc["AP50"],
        "AP75": voc["AP75"],
        "APs": None,
        "APm": None,
        "APl": None,
        "protocol": f"VOC {metric} AP (AP over IoU 0.50:0.95, as Detectron2's VOC evaluator)",
        "per_class_AP50": voc["per_class_AP50"],
        "coco_style": coco,
    }


def sync_batchnorm(detector: nn.Module, dc: Detect, world_size: int, device: torch.device) -> tuple[nn.Module, bool]:
    """(the detector, whether synced): with BN fine-tuned over several GPU ranks, every
    BatchNorm becomes SyncBatchNorm (statistics over the images of every rank: the paper's
    SyncBN); elsewhere (gloo on CPU has no SyncBN) each rank normalises its own images."""
    synced = world_size > 1 and dc.norm == "bn" and device.type == "cuda"
    if synced:
        detector = nn.SyncBatchNorm.convert_sync_batchnorm(detector)
    return detector, synced


def per_rank_batch(dc: Detect, world_size: int) -> int:
    """Images per rank and step: detect.batch_size split evenly over the ranks."""
    if dc.batch_size % world_size:
        raise ConfigError(f"detect.batch_size={dc.batch_size} is not a multiple of the {world_size} ranks")
    return dc.batch_size // world_size


def normalisation(dc: Detect, synced: bool, world_size: int) -> str:
    """Which statistics normalise the fine-tuned detector's features, over how many images."""
    per_rank = dc.batch_size // world_size
    if dc.norm == "frozen_bn":
        return f"frozen BN (pretrained statistics), batch {dc.batch_size}"
    if dc.norm == "gn":
        return f"GroupNorm (batch-independent), batch {dc.batch_size}"
    if synced:
        return f"SyncBN over {dc.batch_size} images ({world_size} ranks x {per_rank})"
    ranks = f" on each of {world_size} ranks" if world_size > 1 else ""
    return f"BN over {per_rank} images{ranks}, batch {dc.batch_size}"


def run(
    cfg: dict, ckpt_path: Path, data_dir: Path, out: Path, seed: int | None = None, state_dir: Path | None = None
) -> dict | None:
    """Fine-tune on the train split, score the val split, write the metrics JSON to ``out``
    (rank 0; the other ranks return None); the resume state lives in ``state_dir`` (None: none).
    ``seed`` (default detect.seed) draws the new layers, the batch order and the flips."""
    dc = section("detect", cfg["detect"])
    cfg = {**cfg, "detect": to_dict(dc)}  # the metrics record every setting, defaults included
    seed, watch = dc.seed if seed is None else seed, Stopwatch()
    torch.manual_seed(seed)
    ckpt = checkpoint.load(ckpt_path)
    train_split, val_split = load_splits(data_dir, dc.dataset, dc.voc)
    masks = dc.task == "segmentation"
    train_set, val_set = CocoBoxes(train_split, flip=True, masks=masks), CocoBoxes(val_split, masks=masks)
    num_classes = max(train_split.num_classes, val_split.num_classes)  # label 0 is background
    detector = build_detector(ckpt, dc, num_classes, str(ckpt_path))
    verify_backbone(detector, ckpt["backbone"], str(ckpt_path))
    env = distributed.init()  # one process, or one per GPU under torchrun (detect.ranks)
    device = distributed.rank_device(env.local_rank)
    cpus.use(dc.threads, device.type, dc.workers or None)  # torch threads; decoding: detect.workers
    detector, synced = sync_batchnorm(detector, dc, env.world_size, device)
    detector.to(device)
    per_rank = per_rank_batch(dc, env.world_size)
    loader = torch.utils.data.DataLoader(
        EpochSeeded(train_set, seed),
        batch_size=per_rank,
        sampler=EpochOrder(len(train_set), env.world_size, env.rank, seed),
        collate_fn=collate,
        num_workers=dc.workers,
        pin_memory=device.type == "cuda",
        drop_last=len(train_set) > dc.batch_size,  # equal-sized steps, unless one batch is all there is
        generator=torch.Generator().manual_seed(seed),  # (not the process's stream: the resume restores that)
    )
    head, norm_text, total = dc.head, normalisation(dc, synced, env.world_size), iterations(dc, len(loader))
    log(
        f"{train_split.name}: {len(train_set)} train / {val_split.name}: {len(val_set)} val images, "
        f"{num_classes - 1} classes, {ckpt['arch']}, {dc.task}, head {head}, {norm_text}, "
        f"{total} iterations, seed {seed}, {env.world_size} rank(s) on {device}"
    )
    start = time.time()
    watch.mark("setup")
    model = distributed.ddp(detector, device)
    state = checkpoint.StageState(
        state_dir, run_fingerprint(dc, ckpt_path, seed, train_split), env, log, dc.checkpoint_every
    )
    with watch.phase("fine_tune"):
        curve = train(model, loader, dc, state)
    distributed.check_ranks_agree(detector, "detector")
    metrics = None
    if env.is_main:  # one evaluation, on the full val split
        with watch.phase("evaluate"):
            test_scale(detector, dc)
            metrics = evaluate(val_split, predict(detector, val_set, per_rank), dc)
        metrics.update(
            {
                "epochs": len(curve),
                "iterations": total,
                "train_loss": curve,
                "seconds": round(time.time() - start, 1),
                "arch": ckpt["arch"],
                "method": ckpt.get("method"),
                "head": head,
                "task": dc.task,
                "norm": dc.norm,
                "sync_bn": synced,
                "ranks": env.world_size,
                "batch_size": dc.batch_size,
                "normalisation": norm_text,
                "seed": seed,
                "checkpoint": str(ckpt_path),
                "train_set": train_split.name,
                "val_set": val_split.name,
                "num_train_images": len(train_set),
                "num_val_images": len(val_set),
                "config": cfg,
                "timing": watch.report(),
            }
        )
        atomic_write_json(metrics, out)
    state.retire()
    if env.world_size > 1:
        distributed.barrier()
        distributed.shutdown()
    return metrics


def summarize_trials(paths: list, out: Path) -> dict:
    """One cell's detection metrics from its trials: each AP key is the mean over the trials
    that have it, ``std`` the sample std (None for a single trial); ``trials`` lists each one."""
    trials = []
    for path in paths:
        try:
            trials.append(json.loads(Path(path).read_text()))
        except (FileNotFoundError, json.JSONDecodeError) as err:
            raise FileNotFoundError(f"detection trial unreadable: {path} ({err})") from None
    mean, std = {}, {}
    keys = [*AP_KEYS, *(MASK_KEYS if any("mask_AP" in t for t in trials) else [])]
    for key in keys:
        vals = [t[key] for t in trials if t.get(key) is not None]
        mean[key] = round(statistics.fmean(vals), 3) if vals else None
        std[key] = round(statistics.stdev(vals), 3) if len(vals) > 1 else None  # sample std
    first = trials[0]
    shared = {
        k: first[k]
        for k in (
            "epochs",
            "iterations",
            "arch",
            "method",
            "head",
            "task",
            "norm",
            "batch_size",
            "normalisation",
            "protocol",
            "checkpoint",
            "train_set",
            "val_set",
            "num_train_images",
            "num_val_images",
            "config",
        )
        if k in first
    }
    summary = {
        **mean,
        "std": std,
        "n": len(trials),
        **shared,
        "seconds": round(sum(t.get("seconds", 0) for t in trials), 1),
        "trials": [{k: t.get(k) for k in (*keys, "seed", "train_loss", "seconds")} for t in trials],
    }
    atomic_write_json(summary, out)
    shown = [k for k in ("AP", "AP50", "AP75", "mask_AP", "mask_AP50", "mask_AP75") if k in mean]
    log(
        " ".join(f"{k}={mean[k]}" + (f"±{std[k]}" if std[k] is not None else "") for k in shown)
        + f" over {len(trials)} trial(s) -> {out}"
    )
    return summary


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summarize"]:
        ap = argparse.ArgumentParser(
            prog="python -m pipeline.detect summarize", description="mean and std of a cell's detection trials"
        )
        ap.add_argument("--out", required=True, help="the cell's detect.json")
        ap.add_argument("trials", nargs="+", help="trial metrics JSONs")
        args = ap.parse_args(argv[1:])
        try:
            summarize_trials(args.trials, Path(args.out))
        except FileNotFoundError as err:
            raise SystemExit(f"[detect] error: {err}") from None
        return
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
