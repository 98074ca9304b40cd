"""Metrics of a model: classifier evaluation, FID and its feature extractors, and sharpness."""
