"""TD3's configuration and presets."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_discount,
    check_layers,
    check_non_negative,
    check_positive,
    check_rates,
    check_replay,
)


@dataclass
class TD3Config:
    """Defaults are the TD3 paper's, as its authors' code has them since 2019
    (``sfujim/TD3``, ``main.py`` and ``TD3.py``): one-step transitions, batches of 256, Adam at
    3e-4 for policy and critics, Polyak targets with tau 0.005, target actions smoothed with
    noise of 0.2 clipped at 0.5, the twin critics' squared errors summed, the policy and
    targets updated every 2 critic updates, exploration noise of 0.1, (256, 256) ReLU networks
    initialised as PyTorch's default, 25,000 transitions before learning starts, one update per
    environment step (``samples_per_insert / batch_size``; see
    :class:`~rlherd.agents.sac.SACConfig`). Actions are in the canonical box ``[-1, 1]``,
    so the noises are fractions of half the action range, as the paper's are."""

    # Learning.
    discount: float = 0.99
    n_step: int = 1
    batch_size: int = 256
    learning_rate: float = 3e-4  # the policy's Adam optimiser
    critic_learning_rate: float = 3e-4
    tau: float = 0.005  # Polyak averaging of the targets, at every policy update
    policy_noise: float = 0.2  # target policy smoothing: std of the noise on target actions
    noise_clip: float = 0.5  # ... clipped to this
    policy_delay: int = 2  # critic updates per policy (and target) update

    # Replay (Acme's SampleToInsertRatio: each transition is sampled samples_per_insert times).
    replay_size: int = 1_000_000
    min_replay_size: int = 25_000
    samples_per_insert: float = 256.0  # inf: no rate limit (mono, poly, distributed)
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance

    # Networks.
    policy_sizes: tuple[int, ...] = (256, 256)
    critic_sizes: tuple[int, ...] = (256, 256)
    layer_norm: bool = False  # True: Acme's LayerNormMLP torsos (D4PG's); False: ReLU MLPs
    # False: every layer as PyTorch initialises it, as the authors' code; True: the output
    # layers start near zero, as Acme's (D4PG's).
    near_zero_heads: bool = False

    # Acting.
    # Act uniformly at random in the box until the learner's first step (once min_replay_size
    # transitions are in), as the reference code fills replay before learning starts.
    random_warm_up: bool = True
    sigma: float = 0.1  # std of the Gaussian exploration noise, then clipped to the box
    variable_update_period: int = 1  # actor steps between parameter fetches

    def __post_init__(self) -> None:
        check_layers(self, "policy_sizes", "critic_sizes")
        check_replay(self)
        check_at_least_one(self, "policy_delay", "variable_update_period")
        check_rates(self, "learning_rate", "critic_learning_rate")
        check_positive(self, "tau")
        check_non_negative(self, "policy_noise", "noise_clip", "sigma")
        if self.tau > 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        check_discount(self)


# The preset names and budgets are the continuous agents' (rlherd/agents/continuous.py).
PRESETS: dict[str, dict] = {
    "mujoco": {},  # the paper's tasks: its values
    # The Control Suite: the paper's values; rewards are in [0, 1] and episodes 1,000 steps.
    "control": {},
    # Pendulum and other short tasks: RL Zoo's TD3 on Pendulum-v1 (Adam at 1e-3, discount 0.98),
    # learning from 1,000 transitions, with (64, 64) networks as D4PG's preset has.
    "classic": dict(
        learning_rate=1e-3,
        critic_learning_rate=1e-3,
        discount=0.98,
        min_replay_size=1_000,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
    # rlherd/Reach-v0: D4PG's toy settings, one update per environment step.
    "toy": dict(
        batch_size=64,
        learning_rate=1e-3,
        critic_learning_rate=1e-3,
        min_replay_size=200,
        samples_per_insert=64.0,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
}
