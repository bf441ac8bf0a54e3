"""rlherd: reinforcement learning in PyTorch that runs the same agent at every scale."""

from rlherd.envs import make
from rlherd.run.train import Run, train

__all__ = ["Run", "make", "train"]
__version__ = "0.1.0"
