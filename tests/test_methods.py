"""Every method trains on the embedded data; v3's loss; the ViT adaptation."""
import math

import pytest
import torch
from torch.nn import functional as F

from pipeline.augment import normalize
from pipeline.data import eval_loader
from pipeline.methods import build_model
from pipeline.models import build_backbone
from pipeline.moco.v3 import ctr_loss, momentum_at
from pipeline.optim import build_optimizer

BASE = {"method": "moco", "variant": "v2", "mechanism": "moco", "backbone": "resnet18", "width": 8,
        "cifar_stem": True, "dim": 32, "K": 64, "m": 0.9, "T": 0.2, "epochs": 1, "batch_size": 16,
        "lr": 0.05, "weight_decay": 0.0, "mask_same_source": True, "mlp_dim": 64}
METHODS = {
    "v1": {"variant": "v1"},
    "v2": {},
    "v3_resnet": {"variant": "v3", "T": 1.0, "m": 0.99, "lr": 0.5, "optimizer": "lars"},
    "v3_vit": {"variant": "v3", "backbone": "vit_tiny", "patch_size": 8, "depth": 2, "T": 0.2, "m": 0.99,
               "lr": 1e-3},
    "end_to_end": {"mechanism": "end_to_end"},
    "memory_bank": {"mechanism": "memory_bank", "K": 32, "T": 0.1},
    "supervised": {"method": "supervised", "lr": 0.1},
}


@pytest.fixture(scope="module")
def images(ffcv_small):
    """64 embedded images (uint8), their labels and sample indices."""
    x, y, i = next(iter(eval_loader(ffcv_small / "train.beton", batch_size=64, crop_size=32, workers=1)))
    return x.clone(), y.long().clone(), i.long().clone()


def views(x: torch.Tensor, g: torch.Generator):
    """Two mildly perturbed views: enough signal for a few steps of learning to show."""
    def one():
        noise = torch.randn(x.shape, generator=g) * 0.1
        return normalize(x) + noise
    return one(), one()


@pytest.mark.parametrize("name", list(METHODS))
def test_method_learns_on_embedded_data(name, images):
    torch.manual_seed(0)
    p = {**BASE, **METHODS[name]}
    model = build_model(p, image_size=32, num_classes=10, num_samples=64)
    opt = build_optimizer(p, model.parameters())
    x, y, idx = images
    g = torch.Generator().manual_seed(0)
    losses = []
    for epoch in range(6):
        for b in range(4):  # 4 batches of 16, the same every epoch
            sl = slice(16 * b, 16 * (b + 1))
            if hasattr(model, "set_momentum"):
                model.set_momentum(epoch / 6)
            x1, x2 = views(x[sl], g)
            loss, logits, target = model(x1, x2, idx[sl], y[sl])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            assert math.isfinite(losses[-1])
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first, f"{name}: loss went from {first:.3f} to {last:.3f}"


def test_v3_symmetric_loss_matches_formula():
    torch.manual_seed(0)
    q, k = torch.randn(5, 8), torch.randn(5, 8)
    T = 0.5
    loss, logits, target = ctr_loss(q, k, T)
    qn, kn = F.normalize(q, dim=1), F.normalize(k, dim=1)
    expect = 0.0
    for i in range(5):
        row = [float(qn[i] @ kn[j]) / T for j in range(5)]
        expect += -(row[i] - math.log(sum(math.exp(v) for v in row))) / 5
    assert loss.item() == pytest.approx(2 * T * expect, rel=1e-5)
    assert target.tolist() == list(range(5))


def test_v3_momentum_schedule():
    assert momentum_at(0.99, 0.0) == pytest.approx(0.99)
    assert momentum_at(0.99, 0.5) == pytest.approx(0.995)
    assert momentum_at(0.99, 1.0) == pytest.approx(1.0)


def test_vit_patch_projection_frozen_and_position_embedding_fixed(images):
    torch.manual_seed(0)
    p = {**BASE, **METHODS["v3_vit"]}
    model = build_model(p, image_size=32, num_classes=10, num_samples=64)
    backbone = model.encoder_q.backbone
    assert "pos_embed" not in dict(backbone.named_parameters())
    assert "pos_embed" in dict(backbone.named_buffers())
    patch_before = {k: v.clone() for k, v in backbone.patch_embed.state_dict().items()}
    pos_before = backbone.pos_embed.clone()
    opt = build_optimizer(p, model.parameters())
    x, y, idx = images
    g = torch.Generator().manual_seed(0)
    block_before = backbone.blocks[0].attn.qkv.weight.clone()
    for _ in range(3):
        loss, _, _ = model(*views(x[:16], g), idx[:16])
        opt.zero_grad()
        loss.backward()
        opt.step()
    for k, v in backbone.patch_embed.state_dict().items():
        assert torch.equal(v, patch_before[k]), f"patch projection {k} changed"
    assert torch.equal(backbone.pos_embed, pos_before)
    assert not torch.equal(backbone.blocks[0].attn.qkv.weight, block_before)  # the rest trains


def test_vit_sincos_shape():
    vit = build_backbone({"backbone": "vit_tiny", "patch_size": 8, "image_size": 32, "depth": 1})
    assert vit.pos_embed.shape == (1, 1 + 16, 192)
    assert torch.all(vit.pos_embed[0, 0] == 0)


def test_site_packages_modules_named_like_tests_are_not_rewritten():
    # pyproject's python_files keeps pytest's AST rewriting to our tests: re-parsing timm's
    # test_time_pool.py on import hit CPython 3.11.7's "AST constructor recursion depth
    # mismatch" in CI and failed the ViT test that imported timm first.
    import timm.layers.test_time_pool as module

    assert type(module.__loader__).__name__ != "AssertionRewritingHook"
