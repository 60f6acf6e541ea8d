"""Evaluating a frozen encoder: features, the kNN monitor, VOC-style detection metrics, COCO masks."""
