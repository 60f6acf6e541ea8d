"""The metrics a detection trial reports, by name: box AP in the order of COCOeval.stats, and
mask AP for Mask R-CNN. Apart from evaluate.py so that a cell's summary (summary.py) reads them
without importing torch, torchvision or pycocotools."""

AP_KEYS = ["AP", "AP50", "AP75", "APs", "APm", "APl"]  # the order of COCOeval.stats

MASK_KEYS = [f"mask_{k}" for k in AP_KEYS]  # segm AP, beside the box AP of AP_KEYS
