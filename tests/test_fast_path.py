"""The GPU fast path (pretrain.fast_path: channels_last for ResNets + bf16 autocast) forced on,
on CPU: the Trainer runs the same Python lines as on a GPU, for MoCo v2 (ResNet), v3 (ResNet
and ViT) and end-to-end. A fault on a line only the GPU used to run (issue 25: the Trainer's
channels_last line crashed every CUDA pretraining) fails here."""

import copy

import pytest
import torch
from torch.nn import functional as F

from pipeline.methods.moco.builder import info_nce
from pipeline.methods.moco.v3 import ctr_loss
from pipeline.nets.fast_path import FastPath
from pipeline.pretrain import Job, Trainer, seed_everything
from pipeline.runtime import distributed

CPU = torch.device("cpu")
BASE = {
    "method": "moco",
    "backbone": "resnet18",
    "width": 8,
    "cifar_stem": True,
    "dim": 16,
    "mlp_dim": 32,
    "K": 32,
    "T": 0.2,
    "epochs": 1,
    "batch_size": 16,
    "lr": 0.03,
    "knn_every": 0,
    "threads": 1,
    "seed": 1,
}
FAMILIES = {
    "moco_v2_resnet": {"variant": "v2"},
    "moco_v3_resnet": {"variant": "v3", "T": 1.0, "optimizer": "sgd"},
    "moco_v3_vit": {"variant": "v3", "T": 1.0, "backbone": "vit_tiny", "patch_size": 8, "depth": 2, "lr": 1e-4},
    "end_to_end": {"variant": "v2", "mechanism": "end_to_end"},
}
# One step under the fast path against the same step in fp32 (same weights, views and key
# shuffle). bf16 keeps 8 significant bits: each conv / linear output is rounded by up to 2^-8
# (0.4%) of its size; over the ~20 layers of an encoder the roundings add up like a random
# walk, to about sqrt(20) x 0.4% ~ 2% of the embedding, so a cosine moves by up to ~0.04 and a
# logit (cosine / T, T = 0.2) by up to ~0.2. The loss averages the rows' log-softmax, where
# the errors partly cancel: 0.05. Measured on an AMD EPYC (avx512_bf16): loss 0.004-0.007,
# logits 0.03-0.08 (the logits themselves span up to 1 / T = 5).
LOSS_TOLERANCE = 0.05
LOGIT_TOLERANCE = 0.2


def job_config(family: str, fast_path: str) -> dict:
    return {"data": {"crop_size": 32, "workers": 1}, "pretrain": {**BASE, **FAMILIES[family], "fast_path": fast_path}}


def trainer_for(ffcv_small, tmp_path, family: str, fast_path: str) -> Trainer:
    seed_everything(BASE["seed"])  # the same initial weights for every trainer of a family
    cfg = job_config(family, fast_path)
    return Trainer(Job.of(cfg), ffcv_small, tmp_path / "state", distributed.init(), progress=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_path_steps_on_cpu(ffcv_small, tmp_path, family):
    trainer = trainer_for(ffcv_small, tmp_path, family, "on")
    resnet = FAMILIES[family].get("backbone", BASE["backbone"]).startswith("resnet")
    assert trainer.fast.on and trainer.fast.channels_last == resnet  # split BN too (per sub-batch)
    for v1, v2, labels, index in trainer.loader.batches(0):  # the lines of Trainer.run_epoch
        trainer.train_step(v1, v2, labels, index)
        trainer.step_in_epoch += 1
        if trainer.step_in_epoch == 3:
            break
    assert trainer.step_in_epoch == 3
    row = trainer.epoch_row()
    assert torch.isfinite(torch.tensor(row["loss"])) and row["loss"] > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_path_step_is_the_fp32_step_within_tolerance(ffcv_small, tmp_path, family):
    trainer = trainer_for(ffcv_small, tmp_path, family, "on")
    v1, v2, labels, index = next(iter(trainer.loader.batches(0)))
    torch.manual_seed(0)
    x1, x2 = trainer.augment(v1, v2)
    model_state = copy.deepcopy(trainer.model.state_dict())
    optimizer_state = copy.deepcopy(trainer.optimizer.state_dict())
    torch.manual_seed(1)  # the key shuffle's permutation
    fast_loss, _, fast_logits = trainer.optimize(x1, x2, labels, index)

    trainer.model.load_state_dict(model_state)
    trainer.optimizer.load_state_dict(optimizer_state)
    trainer.fast = FastPath("off", trainer.device, trainer.p.backbone)  # the reference: fp32
    torch.manual_seed(1)
    loss, _, logits = trainer.optimize(x1.contiguous(), x2.contiguous(), labels, index)

    assert fast_logits.dtype == logits.dtype == torch.float32
    assert torch.isfinite(fast_loss) and abs(float(fast_loss - loss)) <= LOSS_TOLERANCE
    assert float((fast_logits - logits).abs().max()) <= LOGIT_TOLERANCE


def test_a_resumed_run_keeps_the_path_its_state_recorded(ffcv_small, tmp_path):
    """A run whose first node took the fast path (auto resolved on: a GPU) and that is requeued
    where auto resolves off (this CPU) goes on in bf16: one run, one precision. A state of
    another run (another seed) does not decide this one's path."""
    first = trainer_for(ffcv_small, tmp_path, "moco_v2_resnet", "auto")
    assert not first.fast.on and first.fast.precision == "fp32"  # auto on a CPU
    first.fast = FastPath("on", first.device, first.p.backbone)  # as the GPU node resolved it
    first.save_state()
    resumed = trainer_for(ffcv_small, tmp_path, "moco_v2_resnet", "auto")
    assert resumed.fast.on and resumed.fast.precision == "bf16 autocast"
    assert "kept from the run's state (auto resolves to off on this cpu)" in resumed.fast.describe()
    assert resumed.load_state()  # and the state itself resumes: the same run
    other = Trainer(
        Job.of({**job_config("moco_v2_resnet", "auto"), "pretrain": {**BASE, "fast_path": "auto", "seed": 2}}),
        ffcv_small,
        tmp_path / "state",
        distributed.init(),
        progress=False,
    )
    assert not other.fast.on and other.fast.kept_note == ""


def unit_rows(n: int, dim: int = 64, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_logits_are_fp32_under_bf16_autocast():
    """The logits as the references compute them, in fp32: q @ negatives.T under bf16
    autocast would round the negatives' cosines to 8 bits (an error ~100x the tolerance)."""
    q, k, negatives, T = unit_rows(8, seed=1), unit_rows(8, seed=2), unit_rows(32, seed=3), 0.2
    expected = torch.cat([(q.double() * k.double()).sum(1, keepdim=True), q.double() @ negatives.double().T], 1) / T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, logits = info_nce(q, k, negatives, T)
        _, v3_logits, _ = ctr_loss(q, k, T)
        unfixed = q @ negatives.T / T  # what the negatives' logits were before
    assert logits.dtype == v3_logits.dtype == torch.float32
    assert float((logits.double() - expected).abs().max()) < 1e-5
    assert float((v3_logits.double() - (q.double() @ k.double().T) / T).abs().max()) < 1e-5
    assert float((unfixed.double() - expected[:, 1:]).abs().max()) > 1e-3  # the test can tell


def test_fast_path_setting():
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    assert FastPath("auto", cuda, "resnet18").channels_last and not FastPath("auto", CPU, "resnet18").on
    assert FastPath("on", CPU, "resnet50").channels_last and not FastPath("on", CPU, "vit_small").channels_last
    assert FastPath(True, CPU, "resnet18").on and not FastPath(False, cuda, "resnet18").on  # YAML's on / off
    assert not FastPath("off", cuda, "resnet18").on
    with pytest.raises(ValueError, match="fast_path"):
        FastPath("fast", CPU, "resnet18")
