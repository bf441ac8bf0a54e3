"""rlherd: reinforcement learning in PyTorch that runs the same agent at every scale.

``rlherd.make`` builds environments (``rlherd.env_factory`` marks a function of one's own
that builds one); ``rlherd.train`` trains an agent (the CLI's ``train``),
``rlherd.train_seeds`` once per seed in parallel processes (``train --seeds``);
``rlherd.load_policy`` returns a run's trained policy to act with; ``rlherd.export`` writes it
as an ONNX or TorchScript file (the CLI's ``export``). They are imported on first
use: the environment stack (Gymnasium) and the training stack (torch, agents, runtimes) load
only in processes that need them, so the ``rlherd`` command answers ``--help`` at once and
BatchEnv workers do not load torch.
"""

from typing import Any

__all__ = ["Run", "env_factory", "export", "load_policy", "make", "train", "train_seeds"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("envs", "make"):  # rlherd.envs was reachable after `import rlherd`: still is
        import rlherd.envs

        return rlherd.envs if name == "envs" else rlherd.envs.make
    if name == "env_factory":
        from rlherd.envs.ids import env_factory

        return env_factory
    if name in ("Run", "train"):
        from rlherd.commands import train as module

        return getattr(module, name)
    if name == "train_seeds":
        from rlherd.commands.seeds import train_seeds

        return train_seeds
    if name == "load_policy":
        from rlherd.commands.evaluate import load_policy

        return load_policy
    if name == "export":
        from rlherd.commands.export import export

        return export
    raise AttributeError(f"module 'rlherd' has no attribute {name!r}")
