"""The detection scenes as a detector's inputs: a COCO-format split as (image, target) pairs
(boxes, labels and, for Mask R-CNN, instance masks), their batching, and the training order
keyed (epoch, index) so that a run resumed mid-epoch draws the same flips and batches as the
uninterrupted one."""

from __future__ import annotations

import torch
from PIL import Image

from pipeline.dag.config import VOC_HAS_NO_MASKS, ConfigError
from pipeline.data.detection import DetectionDataError, DetectionSplit
from pipeline.data.loaders import sample_seed
from pipeline.eval import masks as masks_io
from pipeline.runtime import lean_torchvision

lean_torchvision.load()  # before any torchvision import: see there
from torchvision.transforms.functional import pil_to_tensor  # noqa: E402


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
