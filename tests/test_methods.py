"""Every method trains on the embedded data; v3's loss; the ViT adaptation."""

import math

import pytest
import torch
from torch.nn import functional as F

from pipeline.dag.config import section
from pipeline.data.augment import normalize
from pipeline.data.loaders import Centre, Reading, eval_loader
from pipeline.methods.build import build_model, build_optimizer
from pipeline.methods.moco.v3 import ctr_loss
from pipeline.methods.momentum_target import cosine_momentum as momentum_at
from pipeline.nets.models import build_backbone

BASE = {
    "method": "moco",
    "variant": "v2",
    "mechanism": "moco",
    "backbone": "resnet18",
    "width": 8,
    "cifar_stem": True,
    "dim": 32,
    "K": 64,
    "m": 0.9,
    "T": 0.2,
    "epochs": 1,
    "batch_size": 16,
    "lr": 0.05,
    "weight_decay": 0.0,
    "mask_same_source": True,
    "mlp_dim": 64,
}
METHODS = {
    "v1": {"variant": "v1"},
    "v2": {},
    "v3_resnet": {"variant": "v3", "T": 1.0, "m": 0.99, "lr": 0.5, "optimizer": "lars"},
    "v3_vit": {"variant": "v3", "backbone": "vit_tiny", "patch_size": 8, "depth": 2, "T": 0.2, "m": 0.99, "lr": 1e-3},
    "end_to_end": {"mechanism": "end_to_end"},
    "memory_bank": {"mechanism": "memory_bank", "K": 32, "T": 0.1},
    "supervised": {"method": "supervised", "lr": 0.1},
    "simclr": {"method": "simclr", "T": 0.1, "lr": 0.3, "optimizer": "lars", "mlp_dim": 64},
    "byol": {"method": "byol", "m": 0.99, "lr": 0.25, "lars_trust": 0.02, "optimizer": "lars", "mlp_dim": 64},
}


@pytest.fixture(scope="module")
def images(ffcv_small):
    """64 embedded images (uint8), their labels and sample indices."""
    x, y, i = next(
        iter(eval_loader(ffcv_small / "train.beton", Centre(crop_size=32), Reading(batch_size=64, workers=1)))
    )
    return x.clone(), y.long().clone(), i.long().clone()


def views(x: torch.Tensor, g: torch.Generator):
    """Two mildly perturbed views: enough signal for a few steps of learning to show."""

    def one():
        noise = torch.randn(x.shape, generator=g) * 0.1
        return normalize(x) + noise

    return one(), one()


# Queue methods: their pretext loss is no measure of learning here, since it rises as the queue
# fills with keys of an ever better encoder (and, without the BN-leak guard, it fell for the
# wrong reason). What must improve is the representation: fresh views of the same image closer
# than those of other images, with the query encoder in eval mode (no batch statistics).
REPRESENTATION_CHECKED = {"v1", "v2", "simclr", "byol"}  # BYOL too: without negatives an image's views still meet
EPOCHS = 10


@torch.no_grad()
def instance_loss(model, images: torch.Tensor, seed: int = 5) -> float:
    """In-batch instance discrimination on two fresh views of every image, eval mode."""
    was_training = model.training
    model.eval()
    x1, x2 = views(images, torch.Generator().manual_seed(seed))
    q, k = (F.normalize(model.encoder_q(v), dim=1) for v in (x1, x2))
    model.train(was_training)
    return F.cross_entropy(q @ k.T / 0.2, torch.arange(len(images))).item()


@pytest.mark.parametrize("name", list(METHODS))
def test_method_learns_on_embedded_data(name, images):
    torch.manual_seed(0)
    p = {**BASE, **METHODS[name]}
    model = build_model(section("pretrain", p), image_size=32, num_classes=10, num_samples=64)
    opt = build_optimizer(section("pretrain", p), model.parameters())
    x, y, idx = images
    g = torch.Generator().manual_seed(0)
    before = instance_loss(model, x)
    losses = []
    for epoch in range(EPOCHS):
        for b in range(4):  # 4 batches of 16, the same every epoch
            sl = slice(16 * b, 16 * (b + 1))
            model.on_step(epoch / EPOCHS)  # every method takes the same hooks (MoCo v3: its m schedule)
            x1, x2 = views(x[sl], g)
            loss, logits, target = model(x1, x2, idx[sl], y[sl])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            assert math.isfinite(losses[-1])
    if name in REPRESENTATION_CHECKED:
        after = instance_loss(model, x)
        assert after < before - 0.3, f"{name}: instance loss on fresh views went from {before:.3f} to {after:.3f}"
    else:
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
    model = build_model(section("pretrain", p), image_size=32, num_classes=10, num_samples=64)
    backbone = model.encoder_q.backbone
    assert "pos_embed" not in dict(backbone.named_parameters())
    assert "pos_embed" in dict(backbone.named_buffers())
    patch_before = {k: v.clone() for k, v in backbone.patch_embed.state_dict().items()}
    pos_before = backbone.pos_embed.clone()
    opt = build_optimizer(section("pretrain", p), model.parameters())
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


# --- MoCo v3 as its reference (facebookresearch/moco-v3) ----------------------------------------
def test_vit_small_has_the_reference_twelve_heads():
    vit = build_backbone({"backbone": "vit_small", "patch_size": 16, "image_size": 32, "depth": 1})
    assert vit.blocks[0].attn.num_heads == 12 and vit.embed_dim == 384


def test_vit_initialisation_is_the_reference():
    """xavier-uniform (Q, K, V as three matrices), zero biases, cls token N(0, 1e-6), and the
    patch projection uniform in +-sqrt(6 / (3 p^2 + dim)), zero bias, frozen."""
    torch.manual_seed(0)
    dim, patch = 384, 16
    vit = build_backbone({"backbone": "vit_small", "patch_size": patch, "image_size": 64, "depth": 2})

    def is_uniform_with_bound(w, bound):  # max close to the bound, std = bound / sqrt(3)
        w = w.detach()
        return (
            float(w.abs().max()) <= bound
            and float(w.abs().max()) > 0.98 * bound
            and float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.03)
        )

    proj = vit.patch_embed.proj
    assert is_uniform_with_bound(proj.weight, math.sqrt(6 / (3 * patch * patch + dim)))
    assert torch.all(proj.bias == 0)  # frozen or not: pretrain.freeze_patch_embed (test below)
    qkv = vit.blocks[0].attn.qkv
    for part in qkv.weight.chunk(3):  # each of Q, K, V: a dim x dim xavier matrix
        assert is_uniform_with_bound(part, math.sqrt(6 / (dim + dim)))
    fc1 = vit.blocks[0].mlp.fc1
    assert is_uniform_with_bound(fc1.weight, math.sqrt(6 / (fc1.in_features + fc1.out_features)))
    linears = [m for m in vit.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(torch.all(m.bias == 0) for m in linears if m.bias is not None)
    assert float(vit.cls_token.detach().std()) < 1e-5


@pytest.mark.parametrize(
    "method, key, frozen",
    [("moco", None, True), ("supervised", None, False), ("moco", False, False), ("supervised", True, True)],
)
def test_vit_patch_projection_is_frozen_as_the_config_says(method, key, frozen):
    """pretrain.freeze_patch_embed (moco-v3 main_moco.py --stop-grad-conv1, set for its ViTs):
    unset, frozen for MoCo only; a supervised ViT trains its patch projection."""
    p = {**BASE, **METHODS["v3_vit"], "method": method, "freeze_patch_embed": key}
    patches = build_model(
        section("pretrain", p), image_size=32, num_classes=10, num_samples=64
    ).encoder_q.backbone.patch_embed
    assert [t.requires_grad for t in patches.parameters()] == [not frozen, not frozen]  # weight, bias


def test_v3_predictor_ends_as_the_reference():
    """ResNet: the predictor's last layer is a Linear (no BN); ViT: a BN without affine."""
    resnet = build_model(
        section("pretrain", {**BASE, **METHODS["v3_resnet"]}), image_size=32, num_classes=10, num_samples=64
    )
    vit = build_model(section("pretrain", {**BASE, **METHODS["v3_vit"]}), image_size=32, num_classes=10, num_samples=64)
    assert isinstance(resnet.predictor[-1], torch.nn.Linear)
    assert isinstance(vit.predictor[-1], torch.nn.BatchNorm1d) and not vit.predictor[-1].affine
    for model in (resnet, vit):  # both projectors end in a BN, as the reference
        assert isinstance(model.encoder_q.head[-1], torch.nn.BatchNorm1d)


def test_v3_resnet_starts_each_residual_branch_at_zero():
    model = build_model(
        section("pretrain", {**BASE, **METHODS["v3_resnet"]}), image_size=32, num_classes=10, num_samples=64
    )
    blocks = [b for layer in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model.encoder_q.backbone, layer)]
    assert blocks and all(torch.all(b.bn2.weight == 0) for b in blocks)
    v2 = build_model(section("pretrain", BASE), image_size=32, num_classes=10, num_samples=64)
    assert all(torch.all(b.bn2.weight == 1) for b in v2.encoder_q.backbone.layer1)


def test_v3_vit_probe_lr_is_the_reference():
    from pipeline.probe import settings

    pc = {"protocol": "mocov3", "epochs": 90}
    assert settings(section("probe", pc), {"backbone": "vit_small"})["lr"] == pytest.approx(3.0 * 1024 / 256)
    assert settings(section("probe", pc), {"backbone": "resnet50"})["lr"] == pytest.approx(0.1 * 1024 / 256)
    # MoCo v1/v2's protocol probes a ResNet at lr 30, a ViT as MoCo v3 does: 3 x 256 / 256
    moco = section("probe", {"protocol": "moco", "epochs": 100})
    assert settings(moco, {"backbone": "resnet18"})["lr"] == 30.0
    assert settings(moco, {"backbone": "vit_small"})["lr"] == pytest.approx(3.0)


def test_every_method_has_the_training_loops_interface():
    """pretrain.py calls only these hooks: a new method implements them beside its own code."""
    from pipeline.methods.momentum_target import MomentumTarget
    from pipeline.nets.method import Method

    for name, p in METHODS.items():
        model = build_model(section("pretrain", {**BASE, **p}), image_size=32, num_classes=10, num_samples=64)
        assert isinstance(model, Method), name
        with_ema = p.get("method", "moco") in ("moco", "byol") and p.get("mechanism", "moco") == "moco"
        assert isinstance(model, MomentumTarget) == with_ema, name
        model.on_step(0.5)
        keys = set(model.diagnostics())
        assert ({"m", "drift"} <= keys) == with_ema, name
