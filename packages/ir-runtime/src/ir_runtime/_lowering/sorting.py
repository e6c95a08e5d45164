"""Sorting and selection: sort, topk, kthvalue, median, mode, cumulative max/min,
searchsorted, bucketize, histograms."""

from __future__ import annotations
