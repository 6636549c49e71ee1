"""Metric points logged through the SDK: storing the runner's batches, and reading them for
charts.

`ingest` stores a batch (checked, each point once, within the attempt's cap); `chunks` is how
points are stored, packed, one row per series and batch; `rollups` keeps per-series extents and
bucket summaries as points are stored; `charts` reads series downsampled (from the rollups where
a series is long) and each metric's latest point.
"""
