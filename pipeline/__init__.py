"""MoCo pretraining pipeline."""
