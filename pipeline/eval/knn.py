"""Weighted kNN classifier on frozen features (InstDisc's monitor): cosine similarity,
k nearest training samples vote with weight exp(sim / T)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


@torch.no_grad()
def knn_predict(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    query_feats: torch.Tensor,
    num_classes: int,
    k: int = 200,
    T: float = 0.07,
    chunk: int = 1024,
) -> torch.Tensor:
    """Class scores (N_query x num_classes) for each query feature."""
    bank = F.normalize(train_feats.float(), dim=1)
    k = min(k, bank.shape[0])
    scores = []
    for start in range(0, query_feats.shape[0], chunk):
        q = F.normalize(query_feats[start : start + chunk].float(), dim=1)
        sim, idx = (q @ bank.T).topk(k, dim=1)
        weights = (sim / T).exp()
        votes = torch.zeros(q.shape[0], num_classes, device=q.device)
        votes.scatter_add_(1, train_labels[idx], weights)
        scores.append(votes)
    return torch.cat(scores)


def knn_accuracy(train_feats, train_labels, val_feats, val_labels, num_classes, k=200, T=0.07) -> float:
    pred = knn_predict(train_feats, train_labels, val_feats, num_classes, k, T).argmax(1)
    return 100.0 * float((pred == val_labels).float().mean())
