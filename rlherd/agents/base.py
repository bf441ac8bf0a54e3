"""What every agent's builder shares: its config, its environment, and how it steps a batch."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlherd import envs as rl_envs


class AgentBuilder:
    """Subclasses set ``name``, ``config_class``, ``presets``, ``default_total_steps``,
    ``runtimes`` (those the agent runs on) and ``uses_loop`` (True: it acts step by step through
    the environment loop with an adder; False: its actor unrolls whole rollouts itself, as
    IMPALA's) and add the ``make_*`` methods of :class:`rlherd.core.Builder`."""

    name: str
    config_class: type
    presets: dict[str, dict[str, Any]]
    default_total_steps: dict[str, int]
    runtimes: tuple[str, ...]
    uses_loop: bool
    preset_for = staticmethod(rl_envs.family)  # the preset an env id gets unless one is named

    def __init__(self, config: Any, env_id: str, env_kwargs: dict | None = None):
        self.config = config
        self.env_id = env_id
        self.env_kwargs = env_kwargs or {}

    def make_envs(self, num_envs: int, workers: int | None = None) -> gym.vector.VectorEnv:
        """``num_envs`` environments: ale-py's native vector env for Atari, else a
        :class:`~rlherd.envs.vector.BatchEnv` of ``workers`` processes (default: the config's
        ``env_workers``; 0 steps them in this process)."""
        workers = self.config.env_workers if workers is None else workers
        return rl_envs.make_vector(
            self.env_id,
            num_envs,
            native=self.config.native_vector_env,
            workers=workers,
            **self.env_kwargs,
        )
