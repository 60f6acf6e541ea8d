"""The algorithm core against its definitions: EMA rule, FIFO queue, InfoNCE, no key grads."""

import math
from types import SimpleNamespace

import pytest
import torch
from test_distributed import P
from torch import nn
from torch.nn import functional as F

from pipeline.dag.config import section
from pipeline.methods.info_nce import info_nce
from pipeline.methods.moco.builder import MoCo
from pipeline.methods.moco.model import projection_head
from pipeline.methods.moco.queue import KeyQueue
from pipeline.methods.momentum_target import momentum_update
from pipeline.nets.method import Encoder
from pipeline.nets.models import build_backbone


def tiny_encoder(dim=16):
    backbone = build_backbone({"backbone": "resnet18", "width": 4, "cifar_stem": True})
    return Encoder(backbone, projection_head(backbone.out_dim, dim, mlp=True))


@pytest.mark.parametrize("m", [0.0, 0.9, 0.999, 1.0])
def test_ema_rule(m):
    torch.manual_seed(0)
    q, k = nn.Linear(5, 3), nn.Linear(5, 3)
    old = [p.detach().clone() for p in k.parameters()]
    momentum_update(k, q, m)
    for p_k, p_old, p_q in zip(k.parameters(), old, q.parameters()):
        torch.testing.assert_close(p_k, m * p_old + (1 - m) * p_q, rtol=0, atol=1e-7)
    if m == 0.0:
        assert all(torch.equal(a, b) for a, b in zip(k.parameters(), q.parameters()))
    if m == 1.0:
        assert all(torch.equal(a, b) for a, b in zip(k.parameters(), old))


def test_fifo_order_wraparound_and_age():
    K, B = 8, 2
    queue = KeyQueue(K, 3)
    for step in range(7):  # 14 keys into 8 slots: wraps around
        keys = torch.full((B, 3), float(step))
        queue.enqueue(keys, torch.arange(B) + 10 * step, torch.tensor(step))
    # slots hold steps 3..6; the pointer sits on the oldest (step 3)
    assert int(queue.ptr) == (7 * B) % K == 6
    assert queue.keys[:, 0].tolist() == [4, 4, 5, 5, 6, 6, 3, 3]
    assert queue.source.tolist() == [40, 41, 50, 51, 60, 61, 30, 31]
    mean_age, p99_age, max_age = queue.age_stats(step=7)
    assert max_age == K // B  # the oldest key is exactly K/B steps old
    assert mean_age == 2.5 and 3 <= p99_age <= max_age  # ages 1..4, two keys each


def run_queue(queue, steps, B=2, start=0):
    for step in range(start, start + steps):
        queue.enqueue(torch.full((B, 3), float(step)), torch.arange(B) + 10 * step, torch.tensor(step))
    return queue


def test_random_replacement_is_seeded_and_resumes_exactly():
    K = 16
    a, b = run_queue(KeyQueue(K, 3, "random", seed=1), 30), run_queue(KeyQueue(K, 3, "random", seed=1), 30)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    other = run_queue(KeyQueue(K, 3, "random", seed=2), 30)
    assert not torch.equal(a.enqueued_at, other.enqueued_at)  # the seed chooses the slots
    # killed after 12 steps, resumed from its buffers: the same queue as the uninterrupted one
    first = run_queue(KeyQueue(K, 3, "random", seed=1), 12)
    resumed = KeyQueue(K, 3, "random", seed=1)
    resumed.load_state_dict(first.state_dict())
    run_queue(resumed, 18, start=12)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), resumed.state_dict().values()))
    assert set(a.state_dict()) == set(KeyQueue(K, 3).state_dict())  # same buffers as FIFO's


def test_random_replacement_keeps_keys_older_than_fifos_bound():
    K, B, steps = 16, 2, 200
    fifo, rand = run_queue(KeyQueue(K, 3), steps), run_queue(KeyQueue(K, 3, "random", seed=0), steps)
    assert fifo.age_stats(steps)[2] == K // B
    mean, p99, oldest = rand.age_stats(steps)
    assert oldest > K // B and p99 > K // B  # nothing bounds a key's age under random replacement
    assert mean == pytest.approx(K / B, rel=0.5)  # the mean age is alike: K/B on average


def test_unknown_queue_policy_is_refused():
    with pytest.raises(ValueError, match="fifo"):
        KeyQueue(8, 3, "lifo")


def test_enqueue_rejects_batch_not_dividing_K():
    with pytest.raises(ValueError, match="multiple"):
        KeyQueue(10, 3).enqueue(torch.zeros(3, 3), torch.zeros(3), torch.tensor(0))


def test_info_nce_matches_formula():
    torch.manual_seed(0)
    q, k, neg = (F.normalize(torch.randn(n, 8), dim=1) for n in (4, 4, 6))
    T = 0.2
    loss, logits = info_nce(q, k, neg, T)
    expect = 0.0
    for i in range(4):
        pos = math.exp(float(q[i] @ k[i]) / T)
        negs = sum(math.exp(float(q[i] @ n) / T) for n in neg)
        expect += -math.log(pos / (pos + negs)) / 4
    assert loss.item() == pytest.approx(expect, rel=1e-5)
    assert logits.shape == (4, 7)


def test_mask_same_source_removes_negatives():
    q = F.normalize(torch.randn(2, 4), dim=1)
    neg = F.normalize(torch.randn(3, 4), dim=1)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    _, logits = info_nce(q, q, neg, 1.0, mask)
    assert logits[0, 1] == float("-inf") and torch.isfinite(logits[1]).all()


def test_loss_is_log_k_plus_one_without_signal():
    """Before learning, the positive is no closer than the negatives: loss ~ log(K+1)."""
    torch.manual_seed(0)
    K, dim = 4096, 128
    q, k = F.normalize(torch.randn(64, dim), dim=1), F.normalize(torch.randn(64, dim), dim=1)
    queue = KeyQueue(K, dim)  # a fresh queue holds random unit keys
    loss, logits = info_nce(q, k, queue.keys, T=0.2)
    assert logits.shape == (64, K + 1)
    assert abs(loss.item() - math.log(K + 1)) < 0.25


def test_key_encoder_gets_no_gradient_and_follows_ema():
    torch.manual_seed(0)
    model = MoCo(tiny_encoder(), dim=16, K=64, m=0.9, T=0.2)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    assert all(not p.requires_grad for p in model.encoder_k.parameters())
    assert not any(p is k for p in opt.param_groups[0]["params"] for k in model.encoder_k.parameters())
    x1, x2 = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)
    k_before = [p.clone() for p in model.encoder_k.parameters()]
    q_before = [p.clone() for p in model.encoder_q.parameters()]
    loss, _, _ = model(x1, x2, torch.arange(8))
    loss.backward()
    assert all(p.grad is None for p in model.encoder_k.parameters())
    assert any(p.grad is not None for p in model.encoder_q.parameters())
    # the forward applied theta_k <- m theta_k + (1 - m) theta_q (with theta_q before the step)
    for p_k, old_k, old_q in zip(model.encoder_k.parameters(), k_before, q_before):
        torch.testing.assert_close(p_k, 0.9 * old_k + 0.1 * old_q, rtol=0, atol=1e-6)
    opt.step()
    assert int(model.step) == 1 and int(model.queue.ptr) == 8


def test_symmetric_loss_adds_the_swapped_direction_against_one_queue():
    """The CIFAR demo's --symmetric (moco colab-notebook branch, ModelMoCo.forward): one key-
    encoder update, loss(q1, k2) + loss(q2, k1) against the queue as it was, then both views'
    keys enqueued (k1 then k2)."""
    torch.manual_seed(0)
    model = MoCo(tiny_encoder(), dim=16, K=64, m=0.9, T=0.2, shuffle_bn=False, symmetric=True)
    x1, x2 = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)
    queue = model.queue.keys.clone()
    k_before = [p.clone() for p in model.encoder_k.parameters()]
    q_before = [p.clone() for p in model.encoder_q.parameters()]
    loss, _, _ = model(x1, x2, torch.arange(8))
    for p_k, old_k, old_q in zip(model.encoder_k.parameters(), k_before, q_before):  # one update only
        torch.testing.assert_close(p_k, 0.9 * old_k + 0.1 * old_q, rtol=0, atol=1e-6)
    with torch.no_grad():
        q1, q2 = (F.normalize(model.encoder_q(x), dim=1) for x in (x1, x2))
        k1, k2 = (F.normalize(model.encoder_k(x), dim=1) for x in (x1, x2))

    def nce(q, k):  # -log(exp(q.k/T) / (exp(q.k/T) + sum over the queue)), averaged over the batch
        pos, neg = (q * k).sum(1) / 0.2, q @ queue.T / 0.2
        return float((torch.logsumexp(torch.cat([pos[:, None], neg], 1), 1) - pos).mean())

    assert loss.item() == pytest.approx(nce(q1, k2) + nce(q2, k1), rel=1e-5)
    torch.testing.assert_close(model.queue.keys[:16], torch.cat([k1, k2]), rtol=0, atol=1e-6)
    assert int(model.queue.ptr) == 16 and model.queue.source[:16].tolist() == list(range(8)) * 2


def test_instance_accuracy_counts_ties_as_wrong():
    from pipeline.methods.cross_entropy import strictly_top

    logits = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 0.5], [0.1, 0.3, 0.2]])
    target = torch.zeros(3, dtype=torch.long)
    assert strictly_top(logits, target).tolist() == [False, True, False]


def trained(model, steps, optimizer, record=None):
    torch.manual_seed(1)
    for _ in range(steps):
        if record:
            record.before_step()
        x1, x2 = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)
        loss = model(x1, x2, torch.arange(8))[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if record:
        record.before_step()  # the state after the last step
    return model


def test_key_encoder_check_holds_on_a_run():
    from pipeline.methods.build import build_optimizer
    from pipeline.methods.ema_check import EmaRecord

    torch.manual_seed(0)
    model = MoCo(tiny_encoder(), dim=16, K=32, m=0.9, T=0.2, shuffle_bn=False)
    opt = build_optimizer(section("pretrain", {"method": "moco", "lr": 0.1, "weight_decay": 1e-4}), model.parameters())
    record = EmaRecord(model, steps=3)
    trained(model, 6, opt, record)
    report = record.report(opt)
    assert report["holds"], report
    assert report["ema_replay"]["steps"] == 3 and report["ema_replay"]["max_relative_error"] < 1e-6
    assert report["optimizer_parameters"] == len(list(model.encoder_q.parameters()))
    assert len(report["ema_replay"]["tensors"]) == 4


def test_key_encoder_check_fails_when_the_key_encoder_is_trained_or_the_rule_is_off():
    from pipeline.methods.ema_check import EmaRecord

    torch.manual_seed(0)
    model = MoCo(tiny_encoder(), dim=16, K=32, m=0.9, T=0.2, shuffle_bn=False)
    for p in model.encoder_k.parameters():
        p.requires_grad_(True)  # a bug: the key encoder in the optimizer
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    record = EmaRecord(model, steps=3)
    trained(model, 5, opt, record)
    report = record.report(opt)
    assert not report["holds"] and report["key_parameters_in_optimizer"] > 0
    assert report["key_parameters_with_grad"] > 0

    model = MoCo(tiny_encoder(), dim=16, K=32, m=0.9, T=0.2, shuffle_bn=False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    record = EmaRecord(model, steps=3)
    model.m = 0.5  # the update uses m = 0.5 while the record claims 0.9: the replay must disagree
    record.model = SimpleNamespace(m=0.9, encoder_k=model.encoder_k)
    trained(model, 4, opt, record)
    report = record.report(opt)
    assert report["key_parameters_in_optimizer"] == 0 and not report["holds"]
    assert report["ema_replay"]["max_relative_error"] > 1e-3


def tiny_model(**changes):
    from pipeline.methods.build import build_model

    torch.manual_seed(0)
    return build_model(section("pretrain", {**P, **changes}), 16, 10, 64)  # test_distributed's MoCo v2, 16 px images


def views(n: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randn(n, 3, 16, 16, generator=g)


def test_keys_without_sample_index_enter_the_queue_as_unknown():
    model = tiny_model()
    model.queue.source.fill_(7)  # stands for the indices of earlier batches
    model(*views(4), None)
    assert model.queue.source[:4].tolist() == [-1] * 4 and set(model.queue.source[4:].tolist()) == {7}


def test_memory_bank_needs_enough_samples_and_each_index():
    from pipeline.methods.build import bn_guard_text
    from pipeline.methods.moco.mechanisms import MemoryBank

    model = tiny_model(mechanism="memory_bank")
    assert bn_guard_text(model, 1) == "not applicable (no key batch normalised apart from its queries)"
    assert model.diagnostics_state() is None  # nothing beyond the state dict to resume
    with pytest.raises(ValueError, match="the memory bank needs each sample's index"):
        model(*views(4), None)
    with pytest.raises(ValueError, match=r"K=64 negatives need more than K samples \(the training set has 64\)"):
        MemoryBank(model.encoder_q, num_samples=64, dim=16, K=64, m=0.5, T=0.2)
