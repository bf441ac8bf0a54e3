"""SAC's configuration and presets."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_discount,
    check_layers,
    check_positive,
    check_rates,
    check_replay,
    check_temperature,
)


@dataclass
class SACConfig:
    """Defaults are Stable-Baselines3's SAC, as RL Zoo runs it on Gymnasium's MuJoCo tasks
    (``hyperparams/sac.yml``; Haarnoja et al.'s "Applications" paper agrees): one-step
    transitions, batches of 256, Adam at 3e-4 for the policy, the critics and the temperature,
    Polyak targets with tau 0.005, a temperature that starts at 1 and is tuned toward an entropy
    of minus the action dimension, (256, 256) ReLU networks, a million transitions and 10,000
    before learning starts, one update per environment step.

    The replay ratio is Acme's ``samples_per_insert``: each transition is sampled that many
    times, so updates per environment step (the "update-to-data ratio") are
    ``samples_per_insert / batch_size``: 256 is one (SAC's), 5,120 is REDQ's and DroQ's 20."""

    # Learning.
    discount: float = 0.99
    n_step: int = 1
    batch_size: int = 256
    policy_learning_rate: float = 3e-4
    critic_learning_rate: float = 3e-4  # the critics' and the temperature's
    tau: float = 0.005  # Polyak averaging of the target critics, every learner step
    entropy_coefficient: float | None = None  # alpha; None: tuned toward target_entropy
    target_entropy: float | None = None  # None: minus the action dimension (SAC's)

    # Replay (Acme's SampleToInsertRatio: each transition is sampled samples_per_insert times).
    replay_size: int = 1_000_000
    min_replay_size: int = 10_000
    samples_per_insert: float = 256.0  # inf: no rate limit (mono, poly, distributed)
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance

    # Networks.
    policy_sizes: tuple[int, ...] = (256, 256)
    critic_sizes: tuple[int, ...] = (256, 256)
    layer_norm: bool = False  # True: Acme's LayerNormMLP torsos (CQL's); False: ReLU MLPs
    near_zero_heads: bool = True  # output layers start near zero (Acme's); False: PyTorch's default

    # Acting.
    # Act uniformly at random in the box until the learner's first step (once min_replay_size
    # transitions are in), as the reference code fills replay before learning starts.
    random_warm_up: bool = True
    variable_update_period: int = 1  # actor steps between parameter fetches

    def __post_init__(self) -> None:
        check_layers(self, "policy_sizes", "critic_sizes")
        check_replay(self)
        check_at_least_one(self, "variable_update_period")
        check_rates(self, "policy_learning_rate", "critic_learning_rate")
        check_positive(self, "tau")
        if self.tau > 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        check_temperature(self)
        check_discount(self)


# The preset names and budgets are the continuous agents' (rlherd/agents/continuous.py).
PRESETS: dict[str, dict] = {
    # Gymnasium's MuJoCo tasks: the defaults (RL Zoo's SAC for Hopper, HalfCheetah, Walker2d,
    # Ant: learning_starts 10,000, everything else Stable-Baselines3's default).
    "mujoco": {},
    # The Control Suite from state features: the defaults, learning from 5,000 random steps as
    # Yarats and Kostrikov's pytorch_sac does (the state SAC of the DrQ paper). That code also
    # widens the networks to (1024, 1024) with batches of 1,024: about 60 times the arithmetic
    # of an update here, hours per 100k steps on a CPU (set policy_sizes, critic_sizes,
    # batch_size).
    "control": dict(min_replay_size=5_000),
    # Pendulum and other short tasks: RL Zoo's SAC on Pendulum-v1 (Adam at 1e-3; the rest the
    # defaults), learning from 256 transitions (RL Zoo's 100 are less than a batch here), with
    # (64, 64) networks as D4PG's preset has.
    "classic": dict(
        policy_learning_rate=1e-3,
        critic_learning_rate=1e-3,
        min_replay_size=256,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
    # rlherd/Reach-v0: D4PG's toy settings, one update per environment step.
    "toy": dict(
        batch_size=64,
        policy_learning_rate=1e-3,
        critic_learning_rate=1e-3,
        min_replay_size=200,
        samples_per_insert=64.0,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
}
