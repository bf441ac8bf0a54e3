"""MPO's and DMPO's configuration and presets: Acme's defaults, and settings for small tasks."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_critic,
    check_layers,
    check_positive,
    check_rates,
    check_replay,
)


@dataclass
class MPOConfig:
    """Defaults are Acme's MPO (``acme/agents/tf/mpo/agent.py``, ``acme/tf/losses/mpo.py``; the
    JAX agent's loss defaults agree): 5-step transitions, batches of 256 sampled 32 times each,
    20 actions sampled per state, Adam at 1e-4 for policy and critic and 1e-2 for the Lagrange
    multipliers, global-norm clipping at 40, hard target copies every 100 learner steps.
    ``distributional=True`` is DMPO: a categorical critic, as D4PG's."""

    # Learning.
    discount: float = 0.99
    n_step: int = 5
    batch_size: int = 256
    num_samples: int = 20  # actions sampled from the target policy per state (E-step, target)
    learning_rate: float = 1e-4  # the policy's Adam optimiser
    critic_learning_rate: float | None = None  # the critic's Adam optimiser; None: learning_rate
    dual_learning_rate: float = 1e-2  # the Lagrange multipliers' Adam optimiser
    grad_norm_clip: float | None = 40.0  # global-norm clipping of policy and critic gradients
    target_update_period: int = 100  # learner steps between hard copies into the targets

    # MPO's bounds (Acme's MPO loss defaults).
    epsilon: float = 0.1  # E-step: KL of the sample weights from the target policy
    epsilon_mean: float = 2.5e-3  # M-step: KL of the mean's update
    epsilon_stddev: float = 1e-6  # M-step: KL of the standard deviation's update
    # Action penalisation (keeps the Gaussian inside the action box); None: off.
    epsilon_penalty: float | None = 1e-3
    per_dim_constraining: bool = True  # one mean/stddev multiplier per action dimension
    # Initial raw multipliers (the multiplier is softplus(raw) + 1e-8; Acme's values).
    init_log_temperature: float = 10.0
    init_log_alpha_mean: float = 10.0
    init_log_alpha_stddev: float = 1000.0

    # Replay (Acme's SampleToInsertRatio: each transition is sampled samples_per_insert times).
    replay_size: int = 1_000_000
    min_replay_size: int = 1_000
    samples_per_insert: float = 32.0  # inf: no rate limit (mono, poly, distributed)
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance

    # Critic: one value (MPO) or categorical over num_atoms atoms on [vmin, vmax] (DMPO).
    distributional: bool = False
    num_atoms: int = 51
    # None: derived from the task at the first learner step, as D4PG's (rlherd/agents/d4pg).
    vmin: float | None = None
    vmax: float | None = None

    # Networks (Acme's LayerNormMLP torsos; a Gaussian head whose std starts at init_scale).
    policy_sizes: tuple[int, ...] = (256, 256, 256)
    critic_sizes: tuple[int, ...] = (512, 512, 256)
    policy_init_scale: float = 0.7
    policy_min_scale: float = 1e-6

    variable_update_period: int = 1  # actor steps between parameter fetches

    def __post_init__(self) -> None:
        check_layers(self, "policy_sizes", "critic_sizes")
        check_replay(self)
        check_critic(self)
        check_at_least_one(self, "num_samples", "target_update_period", "variable_update_period")
        check_rates(self, "dual_learning_rate")
        check_positive(self, "epsilon", "epsilon_mean", "epsilon_stddev", "policy_init_scale")
        if self.epsilon_penalty is not None and self.epsilon_penalty <= 0:
            raise ValueError(f"epsilon_penalty must be > 0 or None, got {self.epsilon_penalty}")


# The preset names, budgets and runtime suggestions are D4PG's (rlherd/agents/continuous.py).
PRESETS: dict[str, dict] = {
    # The DeepMind Control Suite: Acme's defaults (DMPO's support: +-150, Acme's).
    "control": {},
    # Gymnasium's MuJoCo tasks: Acme's baselines (examples/baselines/rl_continuous/run_mpo.py
    # and run_dmpo.py): (256, 256, 256) networks, Adam at 3e-4, 4-step transitions sampled 64
    # times each, epsilon_mean 0.01, initial std 0.5 (DMPO's support: +-1600).
    "mujoco": dict(
        learning_rate=3e-4,
        n_step=4,
        samples_per_insert=64.0,
        epsilon_mean=0.01,
        policy_init_scale=0.5,
        critic_sizes=(256, 256, 256),
    ),
    # Pendulum and other short tasks: one learner step per environment step, Adam at 1e-3,
    # (64, 64) networks as D4PG's, and the Gymnasium baseline's epsilon_mean and initial std
    # (above) with 3-step transitions: -180 on Pendulum-v1 at 30k steps (seed 1), where Acme's
    # defaults reach -222.
    "classic": dict(
        learning_rate=1e-3,
        samples_per_insert=256.0,
        n_step=3,
        epsilon_mean=0.01,
        policy_init_scale=0.5,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
    # rlherd/Reach-v0: a narrower initial std and one-step transitions let the policy find the
    # goal's tolerance within 3,000 steps (training returns 0.61-0.79, seeds 0-4, MPO and DMPO).
    "toy": dict(
        batch_size=64,
        learning_rate=1e-3,
        min_replay_size=200,
        samples_per_insert=64.0,
        n_step=1,
        epsilon_mean=0.01,
        policy_init_scale=0.3,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
        target_update_period=50,
    ),
}
