"""Replay: tables with selectors and rate limiters (Reverb's role), adders and datasets."""

from rlherd.replay.adders import BatchAdder, EpisodeAdder, NStepTransitionAdder, SequenceAdder
from rlherd.replay.dataset import ReplayDataset, ReplaySample, importance_weights
from rlherd.replay.rate_limiters import (
    Bursts,
    MinSize,
    Queue,
    RateLimiter,
    SampleToInsertRatio,
)
from rlherd.replay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform
from rlherd.replay.table import RateLimiterTimeout, SampleBatch, Table

__all__ = [
    "BatchAdder", "EpisodeAdder", "NStepTransitionAdder", "SequenceAdder",
    "ReplayDataset", "ReplaySample", "importance_weights",
    "Bursts", "MinSize", "Queue", "RateLimiter", "SampleToInsertRatio",
    "Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Uniform",
    "RateLimiterTimeout", "SampleBatch", "Table",
]  # fmt: skip
