"""What the continuous-control agents on replay (D4PG, DDPG, TD3, SAC, MPO, DMPO) share: their
presets' names, which one a task gets (:func:`preset_for`), its default budget and the runtime
settings it suggests, and their actor (:class:`ContinuousBuilder`). Each agent's ``PRESETS`` set
its own fields under these names."""

from __future__ import annotations

from typing import Any

from rlherd import envs as rl_envs
from rlherd.agents.acting import TransitionActor, WarmUpPolicy
from rlherd.agents.base import TransitionReplayBuilder
from rlherd.core import EnvSpec, VariableSource
from rlherd.replay import BatchAdder

DEFAULT_TOTAL_STEPS: dict[str, int] = {
    "control": 1_000_000,
    "mujoco": 1_000_000,
    "classic": 30_000,
    "toy": 4_000,
}

# Settings each preset suggests to the runtimes that use them (what a user sets wins): one
# environment, as Acme's single-process agents step.
RUNTIME_DEFAULTS: dict[str, dict] = {
    "control": dict(num_envs=1, envs_per_actor=1),
    "mujoco": dict(num_envs=1, envs_per_actor=1),
    "classic": dict(num_envs=1, num_actors=1, envs_per_actor=1),
    "toy": dict(num_envs=1, num_actors=2, envs_per_actor=1),
}


def preset_for(env_id: str) -> str:
    """``control`` for the Control Suite, ``mujoco`` for Gymnasium's MuJoCo tasks, ``toy`` for
    rlherd's, ``classic`` for the rest (Pendulum-v1, MountainCarContinuous-v0, ...)."""
    family = rl_envs.family(env_id)
    if family in ("control", "toy"):
        return family
    return "mujoco" if rl_envs.is_mujoco(env_id) else "classic"


class ContinuousBuilder(TransitionReplayBuilder):
    """A continuous-control agent on replay: the presets above, and an actor that acts with the
    agent's policy (whose exploration is its own: noise or sampling), fetching parameters every
    ``variable_update_period`` steps (a config field besides :class:`TransitionReplayBuilder`'s)."""

    default_total_steps = DEFAULT_TOTAL_STEPS
    runtime_defaults = RUNTIME_DEFAULTS
    preset_for = staticmethod(preset_for)

    def make_actor(
        self,
        seed: int,
        policy: Any,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: VariableSource | None,
    ) -> TransitionActor:
        if adder is None and isinstance(policy, WarmUpPolicy):
            policy.warm_up = False  # an actor that only acts (rlherd eval --sample) never warms up
        period = self.config.variable_update_period
        return TransitionActor.build(policy, adder, seed, variable_source, period)
