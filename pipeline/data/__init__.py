"""Images in: dataset sources, FFCV conversion helpers, the two-view and evaluation loaders,
augmentations, detection datasets."""
