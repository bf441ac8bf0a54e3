"""What every agent's builder shares: its config, presets and defaults, and which dataflow it
uses. Runtimes reach agents only through the builder methods of :mod:`rlherd.core`."""

from __future__ import annotations

from typing import Any

from rlherd import envs as rl_envs


class AgentBuilder:
    """Subclasses set ``name``, ``config_class``, ``presets`` (config fields per preset),
    ``default_total_steps`` (per preset), ``dataflow`` (``"replay"`` or ``"rollout"``) and
    ``runtime_defaults`` (per preset: settings this agent suggests to whichever runtime uses
    them, e.g. ``num_actors``; what a user sets wins), and add the ``make_*`` methods of
    :class:`rlherd.core.ReplayBuilder` or :class:`rlherd.core.RolloutBuilder`."""

    name: str
    config_class: type
    presets: dict[str, dict[str, Any]]
    default_total_steps: dict[str, int]
    dataflow: str
    runtime_defaults: dict[str, dict[str, Any]] = {}
    preset_for = staticmethod(rl_envs.family)  # the preset an env id gets unless one is named

    def __init__(self, config: Any):
        self.config = config


class RolloutAgentBuilder(AgentBuilder):
    """On-policy agents: learner batches are ``batch_size`` rollouts of ``unroll_length``."""

    dataflow = "rollout"

    @property
    def unroll_length(self) -> int:
        return self.config.unroll_length

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def actor_only_features(self) -> list[str]:
        """Config fields in use whose work happens in the actor rather than the policy (a
        runtime acting with the policy alone, like ``device``, refuses them); none here."""
        return []
