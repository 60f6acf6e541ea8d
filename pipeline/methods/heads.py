"""The MLP heads that MoCo v3, SimCLR and BYOL put on a backbone: Linear-BN-ReLU blocks, then a
Linear, optionally followed by a BatchNorm without affine parameters (MoCo v3, SimCLR)."""

from __future__ import annotations

from torch import nn


def bn_mlp(num_layers: int, in_dim: int, hidden: int, out_dim: int, last_bn: bool = True) -> nn.Sequential:
    """MoCo v3's heads: Linear-BN-ReLU blocks, then Linear (+ BN without affine)."""
    layers = []
    for i in range(num_layers):
        d_in = in_dim if i == 0 else hidden
        if i < num_layers - 1:
            layers += [nn.Linear(d_in, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True)]
        else:
            layers.append(nn.Linear(d_in, out_dim, bias=False))
            if last_bn:
                layers.append(nn.BatchNorm1d(out_dim, affine=False))
    return nn.Sequential(*layers)
