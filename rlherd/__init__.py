"""rlherd: reinforcement learning in PyTorch that runs the same agent at every scale.

``rlherd.make`` builds environments; ``rlherd.train`` trains an agent (the CLI's ``train``). The
training stack (torch, agents, runtimes) is imported on first use, so processes that only step
environments (BatchEnv workers) start quickly.
"""

from typing import Any

from rlherd.envs import make

__all__ = ["Run", "make", "train"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("Run", "train"):
        from rlherd.run import train as module

        return getattr(module, name)
    raise AttributeError(f"module 'rlherd' has no attribute {name!r}")
