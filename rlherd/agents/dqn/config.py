"""DQN's configuration and presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_discount,
    check_non_negative,
    check_positive,
    check_rates,
    check_replay,
)
from rlherd.networks import ObservationConfig


@dataclass
class DQNConfig(ObservationConfig):
    """Defaults follow Rainbow-lite DQN for Atari (double Q, dueling, 3-step returns,
    prioritised replay, Adam). ``samples_per_insert`` is Acme's replay ratio: how many times each
    inserted transition is sampled on average (one learner step per
    ``batch_size / samples_per_insert`` inserts)."""

    # Learning.
    discount: float = 0.99
    n_step: int = 3
    batch_size: int = 32
    optimizer: str = "adam"  # "adam" or "rmsprop" (the MinAtar paper's)
    learning_rate: float = 6.25e-5
    adam_eps: float = 1.5e-4
    rmsprop_alpha: float = 0.95
    rmsprop_eps: float = 0.01
    grad_norm_clip: float = 10.0
    huber_delta: float = 1.0
    double_q: bool = True
    # DQfD's large-margin loss on demonstrated transitions (Hester et al. 2018: weight 1, margin
    # 0.8), added to the TD loss of batches with demonstrations (--demonstrations); 0: off, as
    # in Acme's DQfD.
    margin_loss_weight: float = 0.0
    margin: float = 0.8
    target_update_period: int = 2000  # learner steps
    # Trace the whole learner step (loss, gradient, clip, optimiser) once and compile it with
    # TorchInductor (agents/learning.py, CompiledStep): 1.35-1.9x the eager step's updates/s
    # for the CartPole and MinAtar networks on a CPU, the same numbers up to float rounding.
    # Costs ~5 s of compiling at the first update and needs a C++ compiler (CPUs only tested).
    # benchmarks/learner_step.py measures it.
    compile_step: bool = False

    # Replay.
    replay_size: int = 1_000_000
    min_replay_size: int = 20_000
    samples_per_insert: float = 8.0  # inf: no rate limit (mono, poly, distributed)
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance
    # Stable-Baselines3's schedule instead of a steady ratio: after every `train_every`
    # transitions inserted, `gradient_steps` learner steps in a row (SB3's train_freq and
    # gradient_steps). 0: off, samples_per_insert paces the learner.
    train_every: int = 0
    gradient_steps: int = 1
    prioritized: bool = True
    priority_exponent: float = 0.6
    importance_beta: float = 0.4  # annealed linearly to 1 over the run
    priority_eps: float = 1e-6

    # Network.
    torso: str = "auto"  # auto | mlp | shallow | deep | minatar
    hidden_sizes: tuple[int, ...] = (64, 64)
    dueling: bool = True

    # Acting.
    epsilon_start: float = 1.0
    epsilon_end: float = 0.01
    epsilon_decay_steps: int = 250_000  # transitions all actors have inserted (~their steps)
    variable_update_period: int = 1  # actor steps between parameter fetches (Acme's DQN: 1)

    def __post_init__(self) -> None:
        check_replay(self)
        check_at_least_one(self, "variable_update_period", "target_update_period")
        check_rates(self, "learning_rate")
        check_positive(self, "adam_eps", "rmsprop_eps", "grad_norm_clip", "huber_delta")
        check_non_negative(self, "epsilon_decay_steps", "importance_beta", "priority_eps")
        for name in ("epsilon_start", "epsilon_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        check_discount(self)
        if self.train_every < 0 or self.gradient_steps < 1:
            raise ValueError(
                f"train_every must be >= 0 and gradient_steps >= 1, got {self.train_every} and "
                f"{self.gradient_steps}"
            )
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {self.optimizer!r}")
        if self.margin_loss_weight < 0 or self.margin < 0:
            raise ValueError(
                f"margin_loss_weight and margin must be >= 0, got {self.margin_loss_weight} and "
                f"{self.margin}"
            )
        if self.priority_exponent < 0:
            raise ValueError(f"priority_exponent must be >= 0, got {self.priority_exponent}")
        if self.prioritized and not self.train_every and math.isinf(self.samples_per_insert):
            raise ValueError(
                "samples_per_insert=inf leaves the number of learner steps open, and prioritised "
                "replay anneals its importance weights over them: give a finite ratio, or "
                "prioritized=false"
            )

    @property
    def replay_ratio(self) -> float:
        """Samples per inserted transition, under either schedule."""
        if self.train_every:
            return self.gradient_steps * self.batch_size / self.train_every
        return self.samples_per_insert


PRESETS: dict[str, dict] = {
    "atari": {},
    # CartPole and friends: small network, short schedules, frequent target updates. Reaches
    # 500 on CartPole-v1 within 100k steps (seeds 0, 1, 2).
    "classic": dict(
        n_step=3,
        batch_size=64,
        learning_rate=5e-4,
        adam_eps=1e-8,
        target_update_period=200,
        replay_size=50_000,
        min_replay_size=1_000,
        samples_per_insert=16.0,
        epsilon_decay_steps=20_000,
        epsilon_end=0.01,
        hidden_sizes=(128, 128),
    ),
    # RL Zoo's CartPole-v1 DQN (rl-baselines3-zoo, hyperparams/dqn.yml) on SB3's DQN defaults:
    # lr 2.3e-3 (Adam, eps 1e-8), batch 64, buffer 100k, learning starts 1,000, 128 gradient
    # steps every 256 env steps, epsilon 1 -> 0.04 over 16% of 50k steps, 256x256 ReLU MLP,
    # plain one-step DQN (no double Q, dueling or priorities), Huber loss, gradient norm 10.
    # SB3 copies the target every 10 env steps; no update happens between bursts, so that is a
    # copy after each burst of 128 learner steps.
    "rlzoo": dict(
        n_step=1,
        batch_size=64,
        learning_rate=2.3e-3,
        adam_eps=1e-8,
        double_q=False,
        dueling=False,
        prioritized=False,
        target_update_period=128,
        replay_size=100_000,
        min_replay_size=1_000,
        train_every=256,
        gradient_steps=128,
        epsilon_decay_steps=8_000,
        epsilon_end=0.04,
        hidden_sizes=(256, 256),
    ),
    # MinAtar's default: Dopamine's MinAtar DQN (google/dopamine,
    # labs/environments/minatar/dqn_breakout.gin and dqn_freeway.gin, on JaxDQNAgent's
    # defaults): Adam 2.5e-4 (eps 3.125e-4), batch 32, one update per 4 frames (a quarter of
    # the paper's updates, so about 2x the frames per second here), target copy every 1,000
    # frames (250 updates), replay 100k from 1k, epsilon 1 -> 0.01 over 250k frames, one-step
    # DQN with a squared loss (an unbounded Huber). Kept from rlherd: the paper's network
    # (Dopamine's drops the 128-unit layer) and the global-norm clip at 10 (Dopamine has none).
    "minatar": dict(
        n_step=1,
        batch_size=32,
        learning_rate=2.5e-4,
        adam_eps=3.125e-4,
        huber_delta=float("inf"),
        double_q=False,
        dueling=False,
        prioritized=False,
        target_update_period=250,
        replay_size=100_000,
        min_replay_size=1_000,
        samples_per_insert=8.0,
        epsilon_decay_steps=250_000,
        epsilon_end=0.01,
    ),
    # The MinAtar paper's DQN (Young & Tian 2019): one 16x3x3 conv + 128 fc, RMSProp 2.5e-4,
    # batch 32, one update per step, replay 100k from 5k, target every 1000 updates,
    # epsilon 1 -> 0.1 over 100k frames; plain one-step DQN. About 450 frames/s on one CPU
    # core: 5M frames take 3 hours.
    "minatar_paper": dict(
        n_step=1,
        batch_size=32,
        optimizer="rmsprop",
        learning_rate=2.5e-4,
        double_q=False,
        dueling=False,
        prioritized=False,
        target_update_period=1000,
        replay_size=100_000,
        min_replay_size=5_000,
        samples_per_insert=32.0,
        epsilon_decay_steps=100_000,
        epsilon_end=0.1,
    ),
    "toy": dict(
        n_step=1,
        batch_size=32,
        learning_rate=1e-3,
        adam_eps=1e-8,
        target_update_period=50,
        replay_size=5_000,
        min_replay_size=200,
        samples_per_insert=8.0,
        epsilon_decay_steps=2_000,
        hidden_sizes=(32,),
    ),
    # Gymnasium's toy text (Taxi, FrozenLake, Blackjack: a Discrete state, one-hot encoded): the
    # classic preset's network and replay with Adam at 1e-3, frequent target copies, and
    # exploration over the first quarter of Taxi's 200k steps. rlherd's own choice: seed 1,
    # greedy over 100 episodes, Taxi 7.8 at 100k and 200k steps (optimum ~7.9); at 100k
    # FrozenLake 0.71, Blackjack -0.06.
    "toytext": dict(
        batch_size=64,
        learning_rate=1e-3,
        adam_eps=1e-8,
        target_update_period=250,
        replay_size=50_000,
        min_replay_size=1_000,
        epsilon_end=0.05,
        epsilon_decay_steps=50_000,
    ),
    # bsuite (bsuite/<experiment>/<n>): Acme's bsuite DQN, untuned as the Acme paper ran it
    # (examples/bsuite/run_dqn.py with acme/agents/tf/dqn/agent.py's defaults): an MLP of
    # (50, 50), 5-step double Q-learning, batch 256, Adam at 1e-3, target copies every 100
    # learner steps, prioritized replay (0.6, importance exponent 0.2) learning from 1,000
    # transitions, 32 samples per insert, a constant epsilon of 0.05, no dueling head, gradients
    # clipped at a norm of 1e10 (Acme's "no clipping"). Not
    # Acme's: Acme's learner clips rewards to [-1, 1] and rlherd's does not; replay holds 100,000
    # transitions, not a million (memory, with several ids at once); the importance exponent
    # anneals toward 1 over the run's step bound (10M), so it stays near Acme's fixed 0.2.
    "bsuite": dict(
        n_step=5,
        batch_size=256,
        learning_rate=1e-3,
        adam_eps=1e-8,
        target_update_period=100,
        replay_size=100_000,
        min_replay_size=1_000,
        samples_per_insert=32.0,
        prioritized=True,
        priority_exponent=0.6,
        importance_beta=0.2,
        torso="mlp",
        hidden_sizes=(50, 50),
        dueling=False,
        epsilon_start=0.05,
        epsilon_end=0.05,
        grad_norm_clip=1e10,
    ),
}

# PettingZoo games with one shared Q-network, every agent a row (rlherd.envs.pettingzoo): the
# classic preset, on 12 rows (4 games of 3 agents, 3 of 4: RUNTIME_DEFAULTS).
PRESETS["pettingzoo"] = PRESETS["classic"]

DEFAULT_TOTAL_STEPS: dict[str, int] = {
    "atari": 10_000_000,
    "classic": 100_000,
    "rlzoo": 50_000,
    "minatar": 5_000_000,
    "minatar_paper": 5_000_000,
    "toy": 10_000,
    "toytext": 200_000,
    "pettingzoo": 1_000_000,  # environment steps (a step of every agent of a game)
}

# Settings each preset suggests to the runtimes that use them (what a user sets wins).
RUNTIME_DEFAULTS: dict[str, dict] = {
    "atari": dict(num_envs=4, envs_per_actor=4),
    "classic": dict(num_envs=4, num_actors=2, envs_per_actor=2),
    "rlzoo": dict(num_envs=1, num_actors=1, envs_per_actor=1),  # SB3 steps one environment
    # Dopamine steps one environment; acting on 4 at once (the same updates per frame) is about
    # 1.3x the frames per second on 2 CPU cores.
    "minatar": dict(num_envs=4, envs_per_actor=4),
    "minatar_paper": dict(num_envs=1, envs_per_actor=1),  # the MinAtar paper steps one env
    "toy": dict(num_envs=2, num_actors=2, envs_per_actor=1),
    "toytext": dict(num_envs=4, num_actors=2, envs_per_actor=2),
    "pettingzoo": dict(num_envs=12, num_actors=1, envs_per_actor=12),  # rows: whole games
}

# DQfD (Hester et al. 2018) as Acme has it: DQN with demonstrations mixed into every batch at a
# fixed ratio (the runtime's --demonstrations / --demonstration-ratio, which the dqfd agent
# sets by default: the environment's scripted expert, half of each batch). Acme's bsuite DQfD
# (acme/agents/tf/dqfd/agent.py, examples/offline/run_dqfd.py): uniform replay, 5-step double
# Q-learning, batch 256, lr 1e-3, samples_per_insert 8, target copies every 100 learner steps,
# learning from 1,000 transitions, a constant epsilon of 0.05; no large-margin loss.
DQFD_PRESETS: dict[str, dict] = {
    **PRESETS,
    "toy": dict(
        n_step=5,
        batch_size=256,
        learning_rate=1e-3,
        adam_eps=1e-8,
        prioritized=False,
        target_update_period=100,
        replay_size=100_000,
        min_replay_size=1_000,
        samples_per_insert=8.0,
        epsilon_start=0.05,
        epsilon_end=0.05,
        hidden_sizes=(64, 64),
    ),
}
# Acme's bsuite DQfD (examples/offline/run_dqfd.py): its bsuite DQN with uniform replay and 8
# samples per insert, half of each batch demonstrations (the Acme paper's, section 4.8: see
# rlherd.envs.bsuite_env.DeepSea).
DQFD_PRESETS["bsuite"] = dict(PRESETS["bsuite"], prioritized=False, samples_per_insert=8.0)
DQFD_DEFAULT_TOTAL_STEPS = {**DEFAULT_TOTAL_STEPS, "toy": 100_000}
DEMONSTRATIONS = dict(demonstrations="expert", demonstration_ratio=0.5)  # Acme's bsuite DQfD
DQFD_RUNTIME_DEFAULTS = {name: {**RUNTIME_DEFAULTS.get(name, {}), **DEMONSTRATIONS}
                         for name in DQFD_PRESETS}  # fmt: skip
