"""D4PG's and DDPG's configuration and presets: Acme's defaults, and settings for small tasks."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import check_at_least_one, check_critic, check_layers, check_replay


@dataclass
class D4PGConfig:
    """Defaults are Acme's D4PG (``acme/agents/tf/d4pg/agent.py`` and ``networks.py``; the JAX
    config agrees): 5-step transitions, batches of 256, each transition sampled 32 times, Adam at
    1e-4 for policy and critic, global-norm clipping at 40, a hard target copy every 100 learner
    steps, Gaussian exploration of 0.3 in the canonical ``[-1, 1]`` box.
    ``distributional=False`` is DDPG (Lillicrap et al. 2016, as Acme's TF DDPG): a scalar critic
    learned by squared TD error."""

    # Learning.
    discount: float = 0.99
    n_step: int = 5
    batch_size: int = 256
    learning_rate: float = 1e-4  # the policy's Adam optimiser
    critic_learning_rate: float | None = None  # the critic's Adam optimiser; None: learning_rate
    grad_norm_clip: float | None = 40.0  # global-norm clipping of each network's gradient
    # DPG's action gradient dQ/da is clipped to this norm per sample (Acme's dqda_clipping).
    dqda_clip: float | None = 1.0
    target_update_period: int = 100  # learner steps between hard copies into the targets

    # Replay (Acme's SampleToInsertRatio: each transition is sampled samples_per_insert times).
    replay_size: int = 1_000_000
    min_replay_size: int = 1_000
    samples_per_insert: float = 32.0  # inf: no rate limit (mono, poly, distributed)
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance

    # Critic: categorical over num_atoms atoms on [vmin, vmax] (D4PG), or one value (DDPG).
    distributional: bool = True
    num_atoms: int = 51
    # None: derived from the task's rewards at the first learner step: the discounted returns
    # that the per-step rewards seen allow, [min(r, 0), max(r, 0)] / (1 - discount), widened by
    # a tenth (rlherd.agents.learning.SupportPlacer). Acme uses +-150 on the Control Suite
    # (rewards in [0, 1]) and +-1000 on Gymnasium's MuJoCo tasks.
    vmin: float | None = None
    vmax: float | None = None

    # Networks (Acme's LayerNormMLP torsos).
    policy_sizes: tuple[int, ...] = (256, 256, 256)
    critic_sizes: tuple[int, ...] = (512, 512, 256)

    # Acting.
    sigma: float = 0.3  # std of the Gaussian noise added to actions in [-1, 1], then clipped
    variable_update_period: int = 1  # actor steps between parameter fetches

    def __post_init__(self) -> None:
        check_layers(self, "policy_sizes", "critic_sizes")
        check_replay(self)
        check_critic(self)
        check_at_least_one(self, "target_update_period", "variable_update_period")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if self.dqda_clip is not None and self.dqda_clip <= 0:
            raise ValueError(f"dqda_clip must be > 0 (or None), got {self.dqda_clip}")


# The preset names, budgets and runtime suggestions, shared with MPO: rlherd/agents/continuous.py.
PRESETS: dict[str, dict] = {
    # The DeepMind Control Suite: Acme's defaults (rewards in [0, 1], 1000-step episodes).
    "control": dict(vmin=-150.0, vmax=150.0),
    # Gymnasium's MuJoCo tasks: Acme's baseline (examples/baselines/rl_continuous/run_d4pg.py):
    # (256, 256, 256) networks, Adam at 3e-4, exploration 0.2, support +-1000.
    "mujoco": dict(
        learning_rate=3e-4,
        sigma=0.2,
        critic_sizes=(256, 256, 256),
        vmin=-1000.0,
        vmax=1000.0,
    ),
    # Pendulum and other short tasks: one learner step per environment step (RL Zoo's TD3 and
    # SAC on Pendulum also take one), Adam at 1e-3 (RL Zoo's), (64, 64) networks: at width 256
    # D4PG's policy saturated its tanh on Pendulum-v1 (88% of actions at the bounds; -864 at 30k
    # steps, seed 1) where (64, 64) reaches -189 (docs/benchmarks/continuous-control.md).
    "classic": dict(
        learning_rate=1e-3,
        samples_per_insert=256.0,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
    ),
    # rlherd/Reach-v0: one-step transitions (with 3, DDPG ran into the walls on 3 of seeds 0-4);
    # 4,000 steps give training returns of 0.31-0.68 (DDPG) and 0.6-0.7 (D4PG) on seeds 0-4.
    "toy": dict(
        batch_size=64,
        learning_rate=1e-3,
        min_replay_size=200,
        samples_per_insert=64.0,
        n_step=1,
        policy_sizes=(64, 64),
        critic_sizes=(64, 64),
        target_update_period=50,
    ),
}
