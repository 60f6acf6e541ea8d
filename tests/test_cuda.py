"""CUDA paths (run by bench/gpu_check.sh on a GPU machine; deselected by default: -m cuda)."""

import os
import socket

import pytest
import torch
from conftest import require
from test_fast_path import FAMILIES, trainer_for

from pipeline.dag.config import section
from pipeline.methods.build import build_model, build_optimizer
from pipeline.nets.fast_path import FastPath
from pipeline.runtime import checkpoint

pytestmark = pytest.mark.cuda
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


@pytest.fixture(autouse=True, scope="session")  # session: checked before the session's datasets are built
def cuda_device():
    """Selected (-m cuda) without a GPU: skipped on a laptop, a failure in CI."""
    require(torch.cuda.is_available(), "needs a CUDA device")


def test_bf16_channels_last_step_on_gpu():
    torch.manual_seed(0)
    fast = FastPath("auto", torch.device("cuda"), P["backbone"])  # the Trainer's switch: on for CUDA
    model = fast.model(build_model(section("pretrain", P), 32, 10, 1000).cuda())
    opt = build_optimizer(section("pretrain", P), model.parameters())
    x = fast.images(torch.randn(32, 3, 32, 32, device="cuda"))
    assert fast.on and x.is_contiguous(memory_format=torch.channels_last)
    for _ in range(3):
        with fast.autocast():
            loss, logits, target = model(x, x.flip(3), torch.arange(32, device="cuda"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss) and model.queue.keys.dtype == torch.float32
    assert int(model.queue.ptr) == 96 and all(p.grad is None for p in model.encoder_k.parameters())


def test_nccl_single_rank_collectives():
    import torch.distributed as dist

    from pipeline.methods.gather import gather_all, shuffle_across_ranks, unshuffle_across_ranks

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


def test_detection_fine_tunes_on_the_gpu(tmp_path):
    """The detect stage moves the detector and every batch to the job's GPU (C4 head, BN)."""
    import json

    from pipeline import detect
    from pipeline.dag.sections import Synthetic
    from pipeline.nets.models import build_backbone
    from pipeline.runtime import checkpoint
    from pipeline.synthetic import run as generate

    generate(
        tmp_path / "synth",
        Synthetic(train_per_class=1, val_per_class=1, det_train_images=8, det_val_images=4),
        progress=False,
    )
    arch = {"backbone": "resnet18", "width": 8, "cifar_stem": True}
    checkpoint.save(tmp_path / "ckpt.pt", arch=arch, method="random", backbone=build_backbone(arch).state_dict())
    cfg = {"detect": {"epochs": 1, "batch_size": 4, "lr": 0.01, "image_size": 64, "head": "c4", "norm": "bn"}}
    m = detect.run(cfg, tmp_path / "ckpt.pt", tmp_path / "synth" / "det", tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["AP50"] == m["AP50"] and m["train_loss"][0] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_steps_on_the_gpu(ffcv_small, tmp_path, family):
    """The Trainer as a CUDA job builds it (fast path auto: on): issue 25's crash was here."""
    trainer = trainer_for(ffcv_small, tmp_path, family, "auto")
    assert trainer.device.type == "cuda" and trainer.fast.on
    for v1, v2, labels, index in trainer.loader.batches(0):
        trainer.train_step(v1, v2, labels, index)
        trainer.step_in_epoch += 1
        if trainer.step_in_epoch == 2:
            break
    assert torch.isfinite(torch.tensor(trainer.epoch_row()["loss"]))


def test_cuda_rng_streams_resume_exactly():
    """The key shuffle's draws on the GPU replay after set_rng_state (checkpoint.rng_state)."""
    torch.cuda.manual_seed_all(5)
    torch.randperm(64, device="cuda")
    state = checkpoint.rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    first = torch.randperm(64, device="cuda")
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.randperm(64, device="cuda"), first)
