"""IMPALA's configuration: TorchBeast's Atari defaults, and presets for small tasks."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import check_discount, check_positive, check_rates
from rlherd.networks import PRECISIONS, ObservationConfig


@dataclass
class ImpalaConfig(ObservationConfig):
    """Defaults are TorchBeast's for Atari (``polybeast``/``monobeast`` flags).

    The algorithm only: where actors run, how many, and on which device the learner lives are
    runtime settings (:mod:`rlherd.runtime.settings`).
    """

    # Learning (TorchBeast defaults).
    unroll_length: int = 80  # T: steps per rollout (T + 1 rows, the last one to bootstrap)
    batch_size: int = 8  # rollouts (environment trajectories) per learner step
    discount: float = 0.99
    reward_clip: float | None = 1.0  # rewards clipped to [-clip, clip] in the learner; None: off
    # Rewards squashed to tanh(r / scale) in the learner instead (NLE's "tim" clipping, scale
    # 100: a NetHack score's +1s and +50s keep their order); None: off. Needs reward_clip None.
    reward_tanh_scale: float | None = None
    entropy_cost: float = 0.0006
    baseline_cost: float = 0.5
    grad_norm_clip: float = 40.0
    optimizer: str = "rmsprop"  # "rmsprop" (TorchBeast) or "adam"
    learning_rate: float = 4.8e-4
    lr_decay: bool = True  # linear decay to 0 at total_steps
    rmsprop_alpha: float = 0.99
    rmsprop_momentum: float = 0.0
    rmsprop_eps: float = 0.01
    vtrace_lambda: float = 1.0
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0

    # Network.
    torso: str = "auto"  # auto | mlp | shallow | deep | minatar | nethack
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP torso
    use_lstm: bool = False
    lstm_size: int = 256
    # "bfloat16": the learner runs the torso's convolutions and matrix products in bfloat16
    # (autocast), the rest (LSTM, heads, V-trace, optimiser) in float32; actors act in float32.
    # About 2x faster learner steps with the Atari torso on CPUs with native bfloat16
    # (AVX512-BF16 / AMX) and on GPUs, but slower elsewhere; see rlherd.networks.autocast and
    # benchmarks/impala_throughput.py.
    precision: str = "float32"

    def __post_init__(self) -> None:
        for name in ("unroll_length", "batch_size", "lstm_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_discount(self)
        if self.optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"optimizer must be 'rmsprop' or 'adam', got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        check_rates(self, "learning_rate")
        check_positive(self, "rmsprop_eps")
        if self.reward_tanh_scale is not None and (
            self.reward_tanh_scale <= 0 or self.reward_clip is not None
        ):
            raise ValueError(
                "reward_tanh_scale must be > 0, with reward_clip=None (one transformation of "
                f"the rewards), got {self.reward_tanh_scale} and reward_clip={self.reward_clip}"
            )


PRESETS: dict[str, dict] = {
    # TorchBeast's Atari settings need nothing beyond the defaults.
    "atari": {},
    # Vector-observation control tasks (CartPole, Acrobot, ...): short unrolls, Adam, frequent
    # updates. Adam at 1e-3 with an entropy cost of 0.001 holds CartPole-v1 at 500 from about
    # 500k steps to 1M on seeds 1-3, on mono and distributed alike. At 2e-3 and 0.01 it fell
    # from 500 mid-run (to 80-100 on mono, seed 1), and its sampled policy stayed random
    # enough to drop episodes early: the last 20 training episodes at 1M averaged 232.6-500 on
    # mono and 270.6-484.7 on distributed. 2e-3 with 0.001 still fell mid-run (to 79, seed 1).
    "classic": dict(
        unroll_length=10,
        batch_size=16,
        reward_clip=None,
        entropy_cost=0.001,
        optimizer="adam",
        learning_rate=1e-3,
        grad_norm_clip=40.0,
        hidden_sizes=(64, 64),
    ),
    # MinAtar: the paper's small network (one 16x3x3 conv, 128 fc), 16 x 20 rollouts, and a high
    # learning rate. TorchBeast's RMSprop at 4.8e-4 plateaued at about 5 on Breakout (5.3 at 5M
    # steps): so did every variant at that step size (entropy 0.03, RMSprop or Adam at 1e-3).
    # A sweep of Adam's rate, 2M steps each on the single runtime, seed 0, final training return
    # on Breakout: 1e-3 5.0, 3e-3 11.3, 6e-3 17.2, 1e-2 15.1. gymnax-blines' MinAtar PPO shows
    # the same failure: at 1e-4 it stalls at 5.5. Adam at 6e-3 on 16 x 20 rollouts (entropy
    # 0.01) then left the plateau late on some seeds (seed 1 at 1.35M steps): at 5M its greedy
    # returns on Breakout were 19.9, 15.2 and 21.9 (seeds 0, 1, 2; IQM 19.0, 95% CI [15.2,
    # 21.9]). An `rlherd tune` study on that slow seed (docs/benchmarks/minatar.md) found shorter
    # rollouts from twice as many environments per update, at Adam 7.302e-3, with entropy
    # 0.01814; on three seeds at 5M that scored 22.3 [21.8, 22.9] on Breakout, but left one
    # Freeway seed at the uniform policy. With the preset's entropy of 0.01 kept, the study's
    # rollouts and rate score 22.3 [16.9, 25.1] on Breakout and 64.3 [63.7, 65.0] on Freeway.
    "minatar": dict(
        unroll_length=10,
        batch_size=32,
        entropy_cost=0.01,
        optimizer="adam",
        learning_rate=7.302e-3,
    ),
    # MiniGrid (dict observations: the 7x7 egocentric image through the small-image torso, the
    # direction one-hot): Adam at 1e-3 and an entropy cost of 0.01 on 16 x 20 rollouts. rlherd's
    # own choice, measured on MiniGrid-Empty-5x5-v0 (docs/benchmarks/your-own-environment.md).
    "minigrid": dict(
        unroll_length=20,
        batch_size=16,
        reward_clip=None,
        entropy_cost=0.01,
        optimizer="adam",
        learning_rate=1e-3,
        hidden_sizes=(64,),
    ),
    # NetHack: the NLE paper's TorchBeast baseline. Its network is agent.py's NetHackNet
    # (facebookresearch/nle, nle/agent/agent.py): glyph embeddings, a 9x9 crop around the agent
    # and an MLP over the bottom-line stats (torso "nethack": rlherd.networks.encoders), then an
    # LSTM of 512. Its training values are the NeurIPS 2020 release's (nle/agent/config.yaml and
    # polybeast_learner.py): RMSprop at 2e-4 with eps 1e-6 ("do not use 0.01", TorchBeast's
    # Atari value), entropy 0.001, discount 0.999, rewards squashed by tanh(r / 100) ("tim"),
    # TorchBeast's unrolls of 80 and batches of 8. NLE's observation keys are cut to glyphs and
    # blstats by rlherd.envs (NETHACK_KEYS). The paper trains for a billion steps: neither these
    # values nor TorchBeast's learned to score within the 290k-830k steps measured here
    # (docs/benchmarks/your-own-environment.md).
    "nethack": dict(
        torso="nethack",
        use_lstm=True,
        lstm_size=512,
        learning_rate=2e-4,
        rmsprop_eps=1e-6,
        entropy_cost=0.001,
        discount=0.999,
        reward_clip=None,
        reward_tanh_scale=100.0,
    ),
    # rlherd's tiny test environments.
    "toy": dict(
        unroll_length=8,
        batch_size=8,
        reward_clip=None,
        entropy_cost=0.01,
        optimizer="adam",
        learning_rate=3e-3,
        hidden_sizes=(32,),
    ),
    # bsuite: Acme's bsuite IMPALA, untuned as the Acme paper ran it (examples/bsuite/
    # run_impala.py with acme/agents/tf/impala's defaults): an MLP of (50, 50) and an LSTM of 20,
    # sequences of 3 steps, batches of 16, Adam at 1e-3 (no decay), entropy cost 0.01, baseline
    # cost 0.5, no reward clipping. rlherd's gradients are clipped at 40 (Acme's are not).
    "bsuite": dict(
        unroll_length=3,
        batch_size=16,
        optimizer="adam",
        learning_rate=1e-3,
        lr_decay=False,
        entropy_cost=0.01,
        baseline_cost=0.5,
        reward_clip=None,
        torso="mlp",
        hidden_sizes=(50, 50),
        use_lstm=True,
        lstm_size=20,
    ),
}

# PettingZoo games with one shared policy, every agent a row (rlherd.envs.pettingzoo): the
# classic preset on whole games, 24 rows (8 games of 3 agents, 6 of 4) of 25 steps (MPE's game
# length), Adam at 5e-4 and an entropy cost of 0.01: at 2e-3 the value function diverged on
# simple_spread (baseline loss 1e13 by 400k steps, mono, seed 1). rlherd's choice; it has not
# learned simple_spread in 1M steps (docs/benchmarks/many-agents.md).
PRESETS["pettingzoo"] = dict(PRESETS["classic"], unroll_length=25, batch_size=24,
                             learning_rate=5e-4, entropy_cost=0.01)  # fmt: skip


# How long a run lasts unless --total-steps says otherwise, per preset (agent steps).
DEFAULT_TOTAL_STEPS: dict[str, int] = {
    "atari": 50_000_000,
    "classic": 500_000,
    "minatar": 5_000_000,
    "minigrid": 200_000,
    "nethack": 2_000_000,
    "pettingzoo": 1_000_000,  # environment steps (a step of every agent of a game)
    "toy": 20_000,
}

# Settings each preset suggests to the runtimes that use them (what a user sets wins).
RUNTIME_DEFAULTS: dict[str, dict] = {
    "atari": {},
    "classic": dict(num_actors=2, envs_per_actor=8),
    "minatar": dict(envs_per_actor=8),
    "minigrid": dict(num_actors=2, envs_per_actor=8),
    "nethack": dict(num_actors=2, envs_per_actor=4),
    "pettingzoo": dict(num_actors=2, envs_per_actor=12),  # rows: agents of whole games
    "toy": dict(num_actors=2, envs_per_actor=4),
}
