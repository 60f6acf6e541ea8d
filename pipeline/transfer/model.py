"""The detector over a pretrained backbone: a Faster R-CNN or Mask R-CNN, FPN or C4 head, its
new layers' normalisation (frozen BN, BN, GroupNorm), anchors and mask branch, built from a
checkpoint, and the check that every pretrained tensor reached the detector unchanged."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from pipeline.dag.config import ConfigError
from pipeline.dag.sections import Detect
from pipeline.data.augment import MEAN, STD
from pipeline.nets.models import build_backbone, group_norm
from pipeline.runtime import checkpoint, lean_torchvision

lean_torchvision.load()  # before any torchvision import: see there
from torchvision.models._utils import IntermediateLayerGetter  # noqa: E402
from torchvision.models.detection import FasterRCNN, MaskRCNN  # noqa: E402
from torchvision.models.detection.anchor_utils import AnchorGenerator  # noqa: E402
from torchvision.models.detection.backbone_utils import BackboneWithFPN  # noqa: E402
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor, TwoMLPHead  # noqa: E402
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor  # noqa: E402
from torchvision.models.detection.rpn import RPNHead  # noqa: E402
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign  # noqa: E402
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool  # noqa: E402

# One anchor size per pyramid level (layer1..layer4, pool), as fractions of the image side:
# a x1.5 ladder from 1/8 to ~2/3 covers the 15-46 px shapes of 96 px scenes (IoU >= 0.6 when centred).
ANCHOR_FRACTIONS = (0.125, 0.1875, 0.28125, 0.421875, 0.6328125)

BOX_HEAD_DIM = 256  # torchvision's 1024 triples the cost on CPU for no gain on 10 classes

C4_MASK_DIM = 256  # channels of C4's mask deconvolution (Detectron2's ROI_MASK_HEAD.CONV_DIM)


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
    """The normalisation of the layers the detector adds (FPN, box and mask heads)."""
    return {"none": None, "bn": nn.BatchNorm2d, "gn": group_norm}[dc.new_layers_norm]


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
