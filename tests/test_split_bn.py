"""The BN-leak guard (MoCo paper 3.3) in one process: split BatchNorm + the key shuffle."""

import copy

import pytest
import torch
from torch import nn

from pipeline.dag.config import ConfigError, section
from pipeline.methods.build import bn_guard_text, build_model
from pipeline.methods.moco.builder import MoCo
from pipeline.methods.moco.mechanisms import EndToEnd
from pipeline.methods.split_bn import SplitBatchNorm2d, default_splits, split_batch_norm
from pipeline.nets.method import Encoder
from pipeline.nets.models import build_backbone

P = {
    "method": "moco",
    "variant": "v2",
    "mechanism": "moco",
    "backbone": "resnet18",
    "width": 4,
    "cifar_stem": True,
    "dim": 8,
    "K": 32,
    "m": 0.99,
    "T": 0.2,
    "epochs": 1,
    "batch_size": 16,
    "lr": 0.1,
}


LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@pytest.fixture
def sub_batches_run(monkeypatch) -> list:
    """(layer, j) for each sub-batch a layer normalised alone (the channels_last way)."""
    calls: list = []
    forward_sub_batch = SplitBatchNorm2d._forward_sub_batch

    def spy(self, x, j):
        calls.append((self, j))
        return forward_sub_batch(self, x, j)

    monkeypatch.setattr(SplitBatchNorm2d, "_forward_sub_batch", spy)
    return calls


def through_encoder(bn: nn.BatchNorm2d, splits: int, x: torch.Tensor, layout: str):
    """``bn`` split as an encoder's layer (its hooks around it), run on ``x`` in ``layout``."""
    encoder = split_batch_norm(nn.Sequential(bn), splits)
    return encoder[0], encoder(x.contiguous(memory_format=LAYOUTS[layout]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_bn_normalises_each_sub_batch_with_its_own_statistics(layout, sub_batches_run):
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, momentum=0.3)
    nn.init.normal_(plain.weight)
    nn.init.normal_(plain.bias)
    x = torch.randn(12, 3, 5, 5) * 3 + 1
    split, y = through_encoder(copy.deepcopy(plain), 4, x, layout)
    assert isinstance(split, SplitBatchNorm2d)
    channels_last = layout == "channels_last"
    assert sub_batches_run == ([(split, j) for j in range(4)] if channels_last else []) and split.sub_batch is None
    expected_mean, expected_var = torch.zeros(3), torch.zeros(3)
    for j in range(4):  # sub-batch j: images j, j+4, j+8
        ref = copy.deepcopy(plain)
        torch.testing.assert_close(y[j::4], ref(x[j::4]), rtol=1e-5, atol=1e-5)
        expected_mean += ref.running_mean / 4
        expected_var += ref.running_var / 4
    torch.testing.assert_close(split.running_mean, expected_mean)
    torch.testing.assert_close(split.running_var, expected_var)
    assert int(split.num_batches_tracked) == 1
    split.eval()
    plain.running_mean.copy_(split.running_mean)
    plain.running_var.copy_(split.running_var)
    assert torch.equal(split(x), plain.eval()(x))  # eval: plain BN


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_bn_gradients_through_an_in_place_relu_match_plain_bn_per_sub_batch(layout, sub_batches_run):
    """As in a ResNet (BN then ReLU(inplace=True)): the output is no view, so autograd need not
    rebuild it in backward, and the gradients are those of plain BN on each sub-batch."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3)
    nn.init.normal_(plain.weight)
    x = torch.randn(8, 3, 4, 4, requires_grad=True)
    split, y = through_encoder(copy.deepcopy(plain), 2, x, layout)
    assert len(sub_batches_run) == 2 * (layout == "channels_last")
    assert y._base is None  # not a view of batch_norm's (n/s, s*c, h, w) output
    grad_out = torch.randn(8, 3, 4, 4)
    torch.relu_(y).backward(grad_out)
    xr = x.detach().clone().requires_grad_(True)
    refs = [copy.deepcopy(plain) for _ in range(2)]
    for j, ref in enumerate(refs):  # sub-batch j: images j, j+2, ...
        torch.relu(ref(xr[j::2])).backward(grad_out[j::2])
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split.weight.grad, refs[0].weight.grad + refs[1].weight.grad, rtol=1e-5, atol=1e-6)


def test_one_split_is_plain_batch_norm_bit_for_bit():
    torch.manual_seed(0)
    net = build_backbone({"backbone": "resnet18", "width": 4, "cifar_stem": True})
    same = split_batch_norm(copy.deepcopy(net), 1)
    x = torch.randn(8, 3, 16, 16)
    assert torch.equal(net(x), same(x))
    for (name, a), b in zip(net.state_dict().items(), same.state_dict().values()):
        assert torch.equal(a, b), name


def key_and_query_bn_groups(model: nn.Module, n: int, layout: str = "contiguous"):
    """For each sample i, the set of samples whose content changes the normalised output of
    query i (resp. key i): the images it shares BN statistics with. Found by perturbing each
    image in turn, with the key shuffle's permutation fixed by reseeding."""

    def outputs(x1, x2):
        torch.manual_seed(123)  # the same shuffle every call
        x1, x2 = (x.contiguous(memory_format=LAYOUTS[layout]) for x in (x1, x2))
        with torch.no_grad():
            q = model.encoder_q(x1)
            k = model.encode_keys(x2)
        return q, k

    torch.manual_seed(0)
    x1, x2 = torch.randn(n, 3, 8, 8), torch.randn(n, 3, 8, 8)
    q0, k0 = outputs(x1, x2)
    q_groups, k_groups = [set() for _ in range(n)], [set() for _ in range(n)]
    for j in range(n):
        bumped1, bumped2 = x1.clone(), x2.clone()
        bumped1[j] += 5.0
        bumped2[j] += 5.0
        q, _ = outputs(bumped1, x2)
        _, k = outputs(x1, bumped2)
        for i in range(n):
            if i != j and not torch.allclose(q[i], q0[i], atol=1e-6):
                q_groups[i].add(j)
            if i != j and not torch.allclose(k[i], k0[i], atol=1e-6):
                k_groups[i].add(j)
    return q_groups, k_groups


class BNOnly(nn.Module):
    """A 'network' whose output depends on the other images only through BN statistics."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(x).flatten(1)


@pytest.mark.parametrize("mechanism", ["moco", "end_to_end"])
@pytest.mark.parametrize("layout", LAYOUTS)  # channels_last: the fast path's sub-batches
def test_guard_normalises_key_and_query_over_different_images(mechanism, layout):
    n, splits = 16, 4
    encoder = split_batch_norm(BNOnly(), splits)
    model = MoCo(encoder, dim=192, K=32, m=0.99, T=0.2) if mechanism == "moco" else EndToEnd(encoder, T=0.2)
    model.train()
    q_groups, k_groups = key_and_query_bn_groups(model, n, layout)
    for i in range(n):
        assert q_groups[i] == {j for j in range(n) if j % splits == i % splits} - {i}  # its sub-batch
        assert len(k_groups[i]) == n // splits - 1
        assert q_groups[i] | {i} != k_groups[i] | {i}, f"key {i} shares its query's BN statistics"


def test_without_the_guard_key_and_query_share_statistics():
    """What the guard prevents: the same test fails with shuffle_bn off (and with one split)."""
    n = 16
    for encoder, shuffle in ((split_batch_norm(BNOnly(), 4), False), (BNOnly(), True)):
        model = MoCo(encoder, dim=192, K=32, m=0.99, T=0.2, shuffle_bn=shuffle).train()
        q_groups, k_groups = key_and_query_bn_groups(model, n)
        assert all(q_groups[i] == k_groups[i] for i in range(n))


def test_guard_is_on_by_default_and_off_without_batch_norm():
    model = build_model(section("pretrain", P), 32, 10, 100)
    assert model.shuffle_bn and any(isinstance(m, SplitBatchNorm2d) for m in model.encoder_q.modules())
    assert "2 BN sub-batches" in bn_guard_text(model, 1)  # batch 16: 2 of 8
    gn = build_model(section("pretrain", {**P, "norm": "gn"}), 32, 10, 100)
    assert not gn.shuffle_bn and bn_guard_text(gn, 1) == "not needed (no BatchNorm)"
    off = build_model(section("pretrain", {**P, "shuffle_bn": False}), 32, 10, 100)
    assert not off.shuffle_bn and bn_guard_text(off, 1) == "off (shuffle_bn: false)"
    e2e = build_model(section("pretrain", {**P, "mechanism": "end_to_end"}), 32, 10, 100)
    assert e2e.shuffle_bn and any(isinstance(m, SplitBatchNorm2d) for m in e2e.encoder_q.modules())


def test_guard_geometry():
    assert default_splits(64, 1) == 2  # the demo: 2 sub-batches of 32 (at least 32 images each)
    assert default_splits(128, 1) == 4
    assert default_splits(512, 1) == 8  # the official single-GPU demo: 8 of 64
    assert default_splits(16, 1) == 2
    assert default_splits(256, 8) == 1  # across ranks ShuffleBN alone
    assert default_splits(3, 1) == 1
    with pytest.raises(ConfigError, match="bn_splits >= 2"):
        build_model(section("pretrain", {**P, "bn_splits": 1}), 32, 10, 100)
    with pytest.raises(ConfigError, match="does not divide"):
        build_model(section("pretrain", {**P, "bn_splits": 3}), 32, 10, 100)
    assert build_model(
        section("pretrain", {**P, "bn_splits": 1}), 32, 10, 100, world_size=2
    ).shuffle_bn  # ranks shuffle


def test_checkpointed_backbone_is_plain_batch_norm():
    """The trained model's backbone state loads strictly into a plain-BN backbone and computes
    the same features: probe, detection and exports need nothing of the split."""
    torch.manual_seed(0)
    model = build_model(section("pretrain", P), 32, 10, 100)
    model.train()
    model(torch.randn(16, 3, 32, 32), torch.randn(16, 3, 32, 32), torch.arange(16))
    state = model.encoder_q.backbone.state_dict()
    plain = build_backbone({"backbone": "resnet18", "width": 4, "cifar_stem": True, "norm": "bn"})
    plain.load_state_dict(state, strict=True)
    assert not any(isinstance(m, SplitBatchNorm2d) for m in plain.modules())
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(plain.eval()(x), model.encoder_q.backbone.eval()(x))
    assert isinstance(model.encoder_q, Encoder)


def test_split_batch_norm_refuses_a_batch_it_cannot_split():
    from pipeline.methods.split_bn import SplitBatchNorm2d

    with pytest.raises(ValueError, match="a batch of 3 cannot be split into 2 equal sub-batches"):
        SplitBatchNorm2d(4, splits=2)(torch.randn(3, 4, 2, 2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_batch_norm_without_running_statistics_normalises_each_sub_batch(layout, sub_batches_run):
    x = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(0)) * 5 + 2
    _, y = through_encoder(nn.BatchNorm2d(3, track_running_stats=False, affine=False), 2, x, layout)
    assert len(sub_batches_run) == 2 * (layout == "channels_last")
    reference = torch.nn.BatchNorm2d(3, track_running_stats=False, affine=False)
    for j in (0, 1):  # sub-batch j: images j, j + 2
        torch.testing.assert_close(y[j::2], reference(x[j::2]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_batch_norm_cumulative_average_is_batch_norms_per_sub_batch(layout, sub_batches_run):
    """momentum=None: the running statistics are the plain average over the batches seen, as
    BatchNorm's; the split one holds the mean of its sub-batches' statistics."""
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(4, 3, 2, 2, generator=g) * (1 + i) + i for i in range(2)]
    encoder = split_batch_norm(nn.Sequential(nn.BatchNorm2d(3, momentum=None)), 2)
    split = encoder[0]
    references = [torch.nn.BatchNorm2d(3, momentum=None) for _ in (0, 1)]
    for x in batches:
        encoder(x.contiguous(memory_format=LAYOUTS[layout]))
        for j, ref in enumerate(references):
            ref(x[j::2])
    torch.testing.assert_close(split.running_mean, (references[0].running_mean + references[1].running_mean) / 2)
    torch.testing.assert_close(split.running_var, (references[0].running_var + references[1].running_var) / 2)
    assert int(split.num_batches_tracked) == 2 and len(sub_batches_run) == 4 * (layout == "channels_last")


def resnet_pair(splits: int):
    """A split-BN ResNet encoder (float64: the two layouts' sums then agree to ~1e-12) and its
    copy in channels_last memory."""
    torch.manual_seed(0)
    backbone = build_backbone({"backbone": "resnet18", "width": 4, "cifar_stem": True})
    encoder = split_batch_norm(nn.Sequential(backbone, nn.Linear(32, 8)), splits).double()
    return encoder, copy.deepcopy(encoder).to(memory_format=torch.channels_last)


def test_a_channels_last_encoder_per_sub_batch_is_the_contiguous_one():
    """The fast path's split BN (the encoder run once per sub-batch, the outputs interleaved
    back) computes what the contiguous one does: the same outputs in the same order, gradients,
    running statistics and batch count."""
    contiguous, channels_last = resnet_pair(4)
    x = torch.randn(16, 3, 16, 16, dtype=torch.float64)
    y = contiguous(x)
    y_cl = channels_last(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(y_cl, y, rtol=1e-10, atol=1e-12)
    y.square().sum().backward()
    y_cl.square().sum().backward()
    for (name, p), p_cl in zip(contiguous.named_parameters(), channels_last.parameters()):
        torch.testing.assert_close(p_cl.grad, p.grad, rtol=1e-9, atol=1e-12, msg=name)
    for (name, b), b_cl in zip(contiguous.state_dict().items(), channels_last.state_dict().values()):
        torch.testing.assert_close(b_cl, b, rtol=1e-10, atol=1e-12, msg=name)
    assert not any(m.sub_batch is not None for m in channels_last.modules() if isinstance(m, SplitBatchNorm2d))


def test_sub_batches_run_in_order_only_in_training_and_in_a_deep_copy_on_its_own_layers():
    """Each split layer normalises sub-batches 0..s-1 in turn, image i in sub-batch i % s (a
    layer sees which images by their values); in eval mode BN is per image and the batch goes
    through whole; a deep copy (the key encoder) runs its own layers per sub-batch."""
    _, channels_last = resnet_pair(2)
    x = torch.randn(8, 3, 16, 16, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    key_encoder = copy.deepcopy(channels_last)
    seen = []
    first = next(m for m in key_encoder.modules() if isinstance(m, SplitBatchNorm2d))
    for layer in key_encoder.modules():
        if isinstance(layer, SplitBatchNorm2d):
            layer.register_forward_pre_hook(lambda layer, args: seen.append((layer, layer.sub_batch, len(args[0]))))
    images = []
    first.register_forward_pre_hook(lambda layer, args: images.append(args[0]))
    key_encoder(x)
    layers = [m for m in key_encoder.modules() if isinstance(m, SplitBatchNorm2d)]
    assert seen == [(layer, j, 4) for j in (0, 1) for layer in layers]
    stem = copy.deepcopy(key_encoder[0].conv1).eval()
    for j in (0, 1):  # the first BN's input is the stem's output on images j, j + 2, ...
        torch.testing.assert_close(images[j], stem(x[j::2]))
    assert not any(m.sub_batch is not None for m in channels_last.modules() if isinstance(m, SplitBatchNorm2d))
    seen.clear()
    key_encoder.eval()(x)
    assert seen and all(j is None and n == 8 for _, j, n in seen)
