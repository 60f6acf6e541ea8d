"""CUDA paths (run by bench/gpu_check.sh on a GPU machine; deselected by default: -m cuda)."""

import os
import socket

import pytest
import torch

from pipeline.methods import build_model
from pipeline.optim import build_optimizer

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
P = {
    "method": "moco",
    "variant": "v2",
    "backbone": "resnet18",
    "width": 16,
    "cifar_stem": True,
    "dim": 32,
    "K": 256,
    "m": 0.99,
    "T": 0.2,
    "epochs": 1,
    "batch_size": 32,
    "lr": 0.03,
}


def test_bf16_channels_last_step_on_gpu():
    torch.manual_seed(0)
    model = build_model(P, 32, 10, 1000).cuda().to(memory_format=torch.channels_last)
    opt = build_optimizer(P, model.parameters())
    x = torch.randn(32, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, logits, target = model(x, x.flip(3), torch.arange(32, device="cuda"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss) and model.queue.keys.dtype == torch.float32
    assert int(model.queue.ptr) == 96 and all(p.grad is None for p in model.encoder_k.parameters())


def test_nccl_single_rank_collectives():
    import torch.distributed as dist

    from pipeline.moco.distributed import gather_all, shuffle_across_ranks, unshuffle_across_ranks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        x = torch.randn(8, 4, device="cuda")
        assert torch.equal(gather_all(x), x)
        shuffled, undo = shuffle_across_ranks(x)
        assert torch.equal(unshuffle_across_ranks(shuffled, undo), x)
    finally:
        dist.destroy_process_group()


def test_ffcv_loads_to_gpu(ffcv_small):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import Squeeze, ToDevice, ToTensor, ToTorchImage

    device = torch.device("cuda:0")
    loader = Loader(
        str(ffcv_small / "train.beton"),
        batch_size=16,
        num_workers=2,
        order=OrderOption.RANDOM,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((32, 32)),
                ToTensor(),
                ToDevice(device, non_blocking=True),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), ToDevice(device), Squeeze()],
            "index": [IntDecoder(), ToTensor(), ToDevice(device), Squeeze()],
        },
    )
    images, labels, index = next(iter(loader))
    assert images.is_cuda and images.shape == (16, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.is_cuda


def test_detection_fine_tunes_on_the_gpu(tmp_path):
    """The detect stage moves the detector and every batch to the job's GPU (C4 head, BN)."""
    import json

    from pipeline import checkpoint, detect
    from pipeline.models import build_backbone
    from pipeline.synthetic import run as generate

    generate(
        tmp_path / "synth",
        {"train_per_class": 1, "val_per_class": 1, "det_train_images": 8, "det_val_images": 4},
        progress=False,
    )
    arch = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
    checkpoint.save(tmp_path / "ckpt.pt", arch=arch, method="random", backbone=build_backbone(arch).state_dict())
    cfg = {"detect": {"epochs": 1, "batch_size": 4, "lr": 0.01, "image_size": 64, "head": "c4", "norm": "bn"}}
    m = detect.run(cfg, tmp_path / "ckpt.pt", tmp_path / "synth" / "det", tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["AP50"] == m["AP50"] and m["train_loss"][0] > 0
