"""Split BatchNorm: the BN-leak guard when a rank's whole key batch would share one BN batch.

The leak (MoCo paper, 3.3): a query and its positive key normalised with statistics of the
same images let the model find the positive through the batch statistics instead of the
image content. Across ranks ShuffleBN cures it (each rank's key encoder normalises a random
slice of the global batch). In one process there is nothing to shuffle across, so each batch
is normalised in ``splits`` sub-batches and the keys are shuffled across those sub-batches
before the key encoder (as the official single-GPU MoCo demo does): the images whose
statistics normalise key i are then not those that normalise query i.

``SplitBatchNorm2d`` is a ``BatchNorm2d`` with the same parameters, buffers and state-dict
keys, and normalises like plain BN in eval mode: a checkpoint's backbone loads into a plain
BatchNorm network unchanged (probe, detection, exports).

Two ways to compute the same sub-batches. A contiguous batch is regrouped into channels, a view:
one batch_norm call. In channels_last memory (the fast path) that regrouping copies every
activation it normalises, so there the encoder runs once per sub-batch instead: sub-batch j (the
images i with i % splits == j) goes through the whole encoder alone, each of its BN layers
normalising all it gets, and the outputs are interleaved back into the input's order. The encoder's
output is the same up to float rounding, and no layer copies its activations to split or join them
(the guarded MoCo v2 step on the fast path: 0.91-0.94x its time in blocks, docs/performance.md).
"""

from __future__ import annotations

import types
from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

M = TypeVar("M", bound=nn.Module)
CL = torch.channels_last

MAX_SPLITS = 8  # the official single-GPU demo's bn_splits
# below this, prefer fewer, larger sub-batches: 2 of 32 learnt more reliably than 4 of 16 on the
# demo's batch of 64 (python -m studies.recipe, docs/embedded-data.md)
MIN_IMAGES_PER_SPLIT = 32


class SplitBatchNorm2d(nn.BatchNorm2d):
    """In training, sub-batch j holds the images i with i % splits == j and is normalised
    with its own statistics; the running statistics move towards the mean over sub-batches."""

    def __init__(self, num_features: int, splits: int, **kwargs):
        super().__init__(num_features, **kwargs)
        self.splits = splits
        self.sub_batch: int | None = None  # set by the encoder's forward: the input is this sub-batch alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.splits == 1:
            return super().forward(x)
        if self.sub_batch is not None:
            return self._forward_sub_batch(x, self.sub_batch)
        n, c, h, w = x.shape
        s = self.splits
        if n % s:
            raise ValueError(f"split BatchNorm: a batch of {n} cannot be split into {s} equal sub-batches")
        # (n, c, h, w) -> (n/s, s*c, h, w): image i's channels land in group i % s, so one
        # batch_norm call normalises every sub-batch with its own statistics.
        running_mean, running_var = self.running_mean, self.running_var  # None unless tracked
        mean = running_mean.repeat(s) if running_mean is not None else None
        var = running_var.repeat(s) if running_var is not None else None
        weight = self.weight.repeat(s) if self.affine else None
        bias = self.bias.repeat(s) if self.affine else None
        y = F.batch_norm(x.reshape(n // s, s * c, h, w), mean, var, weight, bias, True, self._track_batch(), self.eps)
        if running_mean is not None and running_var is not None and mean is not None and var is not None:
            with torch.no_grad():
                running_mean.copy_(mean.view(s, c).mean(0))
                running_var.copy_(var.view(s, c).mean(0))
        # Not a view of y: the ReLU(inplace=True) that follows would otherwise make autograd
        # rebuild the view in backward (AsStrided + CopySlices: a copy of every activation).
        return torch.ops.aten._unsafe_view(y, (n, c, h, w)) if y.is_contiguous() else y.reshape(n, c, h, w)

    def _forward_sub_batch(self, x: torch.Tensor, j: int) -> torch.Tensor:
        """``x`` is sub-batch j alone (j = 0..s-1, in this order on every step): one batch_norm.

        The running statistics must move by the update factor f towards the mean of the s
        sub-batches' statistics: r' = (1 - f) r + (f / s) sum_j b_j. Sub-batch j updates them in
        place by its own factor f_j = (f / s) / (1 - (s - 1 - j) f / s); each update is a convex
        combination, so after the last every b_j weighs f / s and r the remaining 1 - f. The batch
        is counted once, with sub-batch 0."""
        s = self.splits
        factor = self._track_batch() if j == 0 else self._update_factor()
        f_j = factor / s / (1 - (s - 1 - j) * factor / s)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, True, f_j, self.eps)

    def _track_batch(self) -> float:
        """Count this batch, as BatchNorm does; returns the running statistics' update factor."""
        if self.num_batches_tracked is not None:  # None unless tracked
            self.num_batches_tracked.add_(1)
        return self._update_factor()

    def _update_factor(self) -> float:
        """The running statistics' update factor for the batch last counted."""
        count = self.num_batches_tracked
        if count is None:
            return 0.0
        if self.momentum is None:  # cumulative moving average, as BatchNorm
            return 1.0 / float(count)
        return self.momentum


def _split_layers(encoder: nn.Module) -> list[SplitBatchNorm2d]:
    return [m for m in encoder.modules() if isinstance(m, SplitBatchNorm2d) and m.splits > 1]


def _forward_per_sub_batch(encoder: nn.Module, x: torch.Tensor, *args, **kwargs):
    """The encoder's forward (bound to it by split_batch_norm): a channels_last batch in training
    goes through the encoder once per sub-batch, the outputs interleaved back in the input's order."""
    forward, layers = type(encoder).forward, _split_layers(encoder)
    s = layers[0].splits
    channels_last = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=CL)
    if not (encoder.training and channels_last and len(x) % s == 0):  # else: BN says why
        return forward(encoder, x, *args, **kwargs)
    outputs = []
    try:
        for j in range(s):
            for layer in layers:
                layer.sub_batch = j
            outputs.append(forward(encoder, x[j::s].contiguous(memory_format=CL), *args, **kwargs))
    finally:  # no layer stays in a sub-batch after a forward that raised
        for layer in layers:
            layer.sub_batch = None
    # outputs[j][k] is image k * s + j
    return torch.stack(outputs, 1).flatten(0, 1)


def has_batch_norm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def split_batch_norm(module: M, splits: int) -> M:
    """Replace every BatchNorm2d of ``module`` (in place) by a SplitBatchNorm2d that holds the
    same parameters and buffers, and have ``module`` (an encoder: images in, one output row per
    image) run channels_last batches once per sub-batch. splits=1 leaves the module untouched."""
    if splits == 1:
        return module
    _replace_batch_norms(module, splits)
    if _split_layers(module):  # its own forward, not a wrapper: the state-dict keys stay the encoder's
        module.forward = types.MethodType(_forward_per_sub_batch, module)  # a deep copy binds its copy
    return module


def _replace_batch_norms(module: nn.Module, splits: int) -> None:
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d:
            split = SplitBatchNorm2d(
                child.num_features,
                splits,
                eps=child.eps,
                momentum=child.momentum,
                affine=child.affine,
                track_running_stats=child.track_running_stats,
            )
            split.load_state_dict(child.state_dict())
            setattr(module, name, split)
        else:
            _replace_batch_norms(child, splits)


def max_splits(module: nn.Module) -> int:
    """The most sub-batches a BatchNorm of ``module`` normalises apart (1: no split BN)."""
    return max([m.splits for m in module.modules() if isinstance(m, SplitBatchNorm2d)], default=1)


def default_splits(batch_per_rank: int, world_size: int) -> int:
    """Across ranks ShuffleBN does the job: BN over each rank's batch (1). In one process: the
    most sub-batches (up to 8) of at least 32 images that divide the batch; 2 for smaller
    batches; 1 only when the batch cannot be split at all."""
    if world_size > 1:
        return 1
    for s in range(MAX_SPLITS, 1, -1):
        if batch_per_rank % s == 0 and batch_per_rank // s >= MIN_IMAGES_PER_SPLIT:
            return s
    return 2 if batch_per_rank % 2 == 0 and batch_per_rank >= 4 else 1
