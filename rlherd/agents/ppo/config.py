"""PPO's configuration: CleanRL's defaults, and presets from RL Zoo's tuned settings and BatchPPO.

``objective="clip"`` is PPO-clip (Schulman et al. 2017). ``objective="kl"`` is BatchPPO
(TensorFlow Agents, Hafner et al. 2017): a KL penalty with adaptive weight and a quadratic
cut-off, separate policy and value networks with their own Adam optimisers, full-batch epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlherd import envs as rl_envs
from rlherd.agents.base import check_discount, check_positive, check_rates
from rlherd.networks import ObservationConfig


@dataclass
class PPOConfig(ObservationConfig):
    """Each update learns on ``batch_size`` rollouts of ``unroll_length`` steps (CleanRL's
    ``num_envs`` and ``num_steps``), running ``epochs`` passes of ``minibatches`` minibatches over
    their valid rows (autoreset rows are dropped). The algorithm only: where and on how many
    environments actors run are runtime settings (:mod:`rlherd.runtime.settings`)."""

    # Collection.
    batch_size: int = 4  # rollouts per update (CleanRL's num_envs)
    unroll_length: int = 128  # steps per rollout (CleanRL's num_steps)

    # Returns.
    discount: float = 0.99
    gae_lambda: float = 0.95

    # Objective.
    objective: str = "clip"  # "clip" (PPO-clip), "kl" (BatchPPO's KL penalty) or "a2c"
    clip: float = 0.2
    anneal_clip: bool = False  # clip falls linearly to 0 with the steps (RL Zoo's lin_0.2)
    value_clip: float | None = None  # clip V to behaviour V +- this (PPO2); None: off
    entropy_cost: float = 0.0
    entropy_cost_final: float | None = None  # linear schedule to this at total_steps; None: fixed
    value_cost: float = 0.5
    normalize_advantages: bool = True
    kl_target: float = 0.01
    kl_init_beta: float = 1.0
    kl_cutoff_factor: float = 2.0
    kl_cutoff_coef: float = 1000.0

    # Optimisation.
    epochs: int = 10
    minibatches: int = 32
    learning_rate: float = 3e-4  # the shared network's, or the policy's when separate optimisers
    value_learning_rate: float | None = None  # a value optimiser of its own (BatchPPO); None: one
    lr_anneal: bool = True  # linear decay to 0 at total_steps
    adam_eps: float = 1e-5
    max_grad_norm: float | None = 0.5
    max_rows_per_pass: int = 65536  # bigger minibatches accumulate gradients over chunks

    # Networks.
    shared_network: bool = False  # one torso for policy and value, or two separate MLPs
    hidden_sizes: tuple[int, ...] = (64, 64)
    value_hidden_sizes: tuple[int, ...] | None = None  # None: same as hidden_sizes
    activation: str = "tanh"  # tanh | relu
    orthogonal_init: bool = True  # CleanRL's: gain sqrt(2), 0.01 for the policy head, 1 value
    init_log_std: float = 0.0  # Gaussian policies: state-independent log std
    tanh_mean: bool = False  # BatchPPO squashes the action mean into [-1, 1]
    mean_init_scale: float = 0.01  # scale of the policy head's initial weights

    # Normalisation (streaming statistics, in checkpoints, used by eval).
    normalize_obs: bool = False
    obs_clip: float = 5.0
    # None, "return" (divide by the std of discounted returns), "reward" (by the std of
    # rewards) or "sign" (CleanRL's ClipRewardEnv for Atari: the reward's sign)
    reward_scaling: str | None = None
    reward_clip: float = 10.0  # after "return" / "reward" scaling

    def __post_init__(self) -> None:
        for name in ("batch_size", "unroll_length", "epochs", "minibatches", "max_rows_per_pass"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.objective not in ("clip", "kl", "a2c"):
            raise ValueError(f"objective must be 'clip', 'kl' or 'a2c', got {self.objective!r}")
        if self.activation not in ("tanh", "relu"):
            raise ValueError(f"activation must be 'tanh' or 'relu', got {self.activation!r}")
        if self.reward_scaling not in (None, "return", "reward", "sign"):
            raise ValueError(
                "reward_scaling must be None, 'return', 'reward' or 'sign', got "
                f"{self.reward_scaling!r}"
            )
        if self.shared_network and self.value_learning_rate is not None:
            raise ValueError(
                "a shared network has one optimiser: set value_learning_rate=None or "
                "shared_network=False"
            )
        check_rates(self, "learning_rate", "value_learning_rate")
        check_positive(self, "adam_eps", "clip", "value_clip", "max_grad_norm", "obs_clip",
                       "reward_clip")  # fmt: skip
        check_discount(self)
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")


# RL Zoo's tuned MuJoCo settings share this network and normalisation. SB3's value loss is the
# plain mean squared error where rlherd's is half of it, so its vf_coef appears doubled below.
_ZOO_MUJOCO = dict(
    batch_size=1,
    unroll_length=512,
    hidden_sizes=(256, 256),
    activation="relu",
    orthogonal_init=False,
    mean_init_scale=1.0,  # SB3's default initialisation, unscaled
    init_log_std=-2.0,
    lr_anneal=False,
    normalize_obs=True,
    obs_clip=10.0,
    reward_scaling="return",
)

# WarpDrive's trainer: A2C on one full batch per iteration, a shared torso with policy and value
# heads, discount 0.98, entropy 0.05.
_WARPDRIVE_A2C = dict(
    objective="a2c",
    epochs=1,
    minibatches=1,
    learning_rate=1e-3,
    lr_anneal=False,
    activation="relu",
    shared_network=True,
    discount=0.98,
    gae_lambda=1.0,
    entropy_cost=0.05,
    max_grad_norm=10.0,
)

_CLEANRL_ATARI = dict(
    batch_size=8,
    unroll_length=128,
    minibatches=4,
    epochs=4,
    learning_rate=2.5e-4,
    clip=0.1,
    value_clip=0.1,
    entropy_cost=0.01,
    reward_scaling="sign",
)

PRESETS: dict[str, dict] = {
    # CleanRL's ppo_continuous_action.py defaults (its published 1M-step MuJoCo figures).
    "cleanrl": dict(
        batch_size=1,
        unroll_length=2048,
        normalize_obs=True,
        reward_scaling="return",
        value_clip=0.2,
    ),
    # RL Zoo's CartPole-v1: 500 within 100k steps.
    "classic": dict(
        batch_size=8,
        unroll_length=32,
        minibatches=1,
        epochs=20,
        discount=0.98,
        gae_lambda=0.8,
        learning_rate=1e-3,
        anneal_clip=True,
    ),
    # PettingZoo games with one shared policy, every agent a row (rlherd.envs.pettingzoo): the
    # MPE script of MAPPO's authors (Yu et al. 2022; marlbenchmark/on-policy, train_mpe.sh:
    # lr 7e-4, ppo_epoch 10, num_mini_batch 1, episode_length 25, and its config's defaults,
    # clip 0.2, GAE lambda 0.95, gamma 0.99, entropy 0.01). It runs 128 games at once; here 24
    # rows (8 games of simple_spread's 3 agents, 6 of 4) of 25 steps.
    "pettingzoo": dict(
        batch_size=24,
        unroll_length=25,
        minibatches=1,
        epochs=10,
        discount=0.99,
        gae_lambda=0.95,
        learning_rate=7e-4,
        entropy_cost=0.01,
        lr_anneal=False,
    ),
    # RL Zoo's LunarLander-v3.
    "lunarlander": dict(
        batch_size=16,
        unroll_length=1024,
        minibatches=256,
        epochs=4,
        discount=0.999,
        gae_lambda=0.98,
        entropy_cost=0.01,
        lr_anneal=False,
    ),
    # RL Zoo's tuned HalfCheetah and Hopper (SB3 PPO with VecNormalize).
    "halfcheetah": dict(
        _ZOO_MUJOCO,
        minibatches=8,
        epochs=20,
        discount=0.98,
        gae_lambda=0.92,
        learning_rate=2.0633e-5,
        entropy_cost=0.000401762,
        clip=0.1,
        max_grad_norm=0.8,
        value_cost=2 * 0.58096,
    ),
    "hopper": dict(
        _ZOO_MUJOCO,
        minibatches=16,
        epochs=5,
        discount=0.999,
        gae_lambda=0.99,
        learning_rate=9.80828e-5,
        entropy_cost=0.00229519,
        clip=0.2,
        max_grad_norm=0.7,
        value_cost=2 * 0.835671,
    ),
    # Other MuJoCo tasks: CleanRL's defaults.
    "mujoco": {},
    # BatchPPO as in the paper: 25 environments (one 1000-step episode each per update on
    # HalfCheetah), 25 full-batch epochs, Adam 1e-4 (policy) and 1e-3 (value), (200, 100) ReLU
    # networks, tanh mean, KL target 0.01, streaming normalisation of observations (clip 5) and
    # rewards (clip 10). The discount is TensorFlow Agents' default.
    "batchppo": dict(
        batch_size=25,
        unroll_length=1000,
        objective="kl",
        epochs=25,
        minibatches=1,
        discount=0.995,
        gae_lambda=1.0,
        learning_rate=1e-4,
        value_learning_rate=1e-3,
        lr_anneal=False,
        adam_eps=1e-8,
        max_grad_norm=None,
        entropy_cost=0.0,
        value_cost=1.0,
        hidden_sizes=(200, 100),
        activation="relu",
        orthogonal_init=False,
        tanh_mean=True,
        mean_init_scale=0.1,
        init_log_std=-1.0498,  # std 0.35
        normalize_obs=True,
        reward_scaling="reward",
    ),
    # WarpDrive's training configurations of the Tag games (device runtime); their environment
    # options are rlherd.envs.reference.tag.WARPDRIVE_TRAINING (pass with --env-kwargs).
    "tag-gridworld": dict(_WARPDRIVE_A2C, unroll_length=100, hidden_sizes=(32, 32)),
    "tag-continuous": dict(_WARPDRIVE_A2C, unroll_length=250, hidden_sizes=(256, 256)),
    # CleanRL's ppo_atari.py (its published Atari figures at 10M steps): 8 environments of 128
    # steps, 4 minibatches, 4 epochs, Adam 2.5e-4 annealed to 0, clip 0.1 (values clipped too),
    # entropy 0.01, gradient norm 0.5, rewards clipped to their sign; the Nature CNN, which
    # rlherd's image torso is for Atari frames. (CleanRL's environments also end an episode at
    # each lost life: pass --env-kwargs episodic_life=true for that.)
    "atari": _CLEANRL_ATARI,
    # MinAtar, on its paper's network (one 16x3x3 conv, 128 fc): the MinAtar PPO of gymnax-blines
    # and PureJaxRL (64 environments of 128 steps, 8 minibatches, 4 epochs, clip 0.2 with the
    # values clipped too, entropy 0.01), Adam 2.5e-3 annealed to 0, rewards as they are (0 or
    # 1). CleanRL's Atari values (8 x 128, 4 minibatches, 2.5e-4) reached 6.3 on Breakout at 2M
    # steps; these 25.2 (seed 0, single runtime; 5e-3 was behind at 1.1M, 17.6 against 21.6),
    # and at 5M 32.7, 22.2 and 30.0 (seeds 0, 1, 2; docs/benchmarks/minatar.md).
    "minatar": dict(
        _CLEANRL_ATARI,
        batch_size=64,
        minibatches=8,
        learning_rate=2.5e-3,
        clip=0.2,
        value_clip=0.2,
        reward_scaling=None,
    ),
    # MiniGrid: the PPO of the MiniGrid authors' starter code (lcswillems/rl-starter-files on
    # torch-ac): 16 environments of 128 steps, 4 epochs of minibatches of 256 rows (8 per
    # update), Adam 1e-3 with eps 1e-8 and no annealing, clip 0.2 with the values clipped too,
    # entropy 0.01, gradient norm 0.5, discount 0.99, GAE 0.95, one shared image network and a
    # 64-unit layer before the heads. Its value loss weighs the squared error by 0.5, rlherd's
    # halves it first: value cost 1. Its network reads the image alone and its 64-unit layer is
    # tanh; rlherd's reads the direction too, through ReLU, with which DoorKey-5x5 passed 0.85
    # at 27k and 45k steps (seeds 1, 2) against 64k and 35k with tanh (0.96 at 100k either way).
    "minigrid": dict(
        batch_size=16,
        unroll_length=128,
        epochs=4,
        minibatches=8,
        learning_rate=1e-3,
        adam_eps=1e-8,
        lr_anneal=False,
        clip=0.2,
        value_clip=0.2,
        entropy_cost=0.01,
        value_cost=1.0,
        max_grad_norm=0.5,
        shared_network=True,  # its convolutions serve both heads
        hidden_sizes=(64,),
        activation="relu",
    ),
    # Gymnasium's toy text (Taxi, FrozenLake, Blackjack; their state a one-hot): CleanRL's
    # network (separate 64x64 tanh MLPs: one shared between policy and value, Taxi's greedy
    # policy stayed at -200) with 8 x 128 rollouts, 4 epochs of 4 minibatches, Adam 1e-3 and an
    # entropy bonus for Taxi's sparse +20. rlherd's own choice: seed 1 at 200k steps, greedy
    # over 100 episodes, Taxi 7.6 (optimum ~7.9); at 100k FrozenLake 0.72, Blackjack -0.01.
    "toytext": dict(
        batch_size=8,
        unroll_length=128,
        minibatches=4,
        epochs=4,
        learning_rate=1e-3,
        entropy_cost=0.01,
    ),
    # rlherd's tiny test environments.
    "toy": dict(batch_size=4, unroll_length=16, minibatches=2, epochs=4, learning_rate=3e-3),
}
# bsuite: Acme has no PPO there; the toy preset, rlherd's choice for tiny tasks, untuned on
# bsuite as the paper's agents were.
PRESETS["bsuite"] = PRESETS["toy"]
PRESETS["mujoco"] = PRESETS["cleanrl"]


def preset_for(env_id: str) -> str:
    """CartPole and co. get ``classic``; HalfCheetah RL Zoo's tuned preset; Hopper and the other
    MuJoCo tasks CleanRL's defaults, which measured far better on Hopper-v5 here
    (docs/benchmarks/continuous-control.md) than RL Zoo's settings (still there as
    ``--preset hopper``)."""
    if env_id in ("tag-gridworld", "tag-continuous"):
        return env_id
    name = env_id.split("-")[0].lower()
    if name in ("halfcheetah", "lunarlander"):
        return name
    if rl_envs.is_mujoco(env_id):
        return "mujoco"
    family = rl_envs.family(env_id)
    return family if family in PRESETS else "classic"


DEFAULT_TOTAL_STEPS: dict[str, int] = {
    "cleanrl": 1_000_000,
    "classic": 100_000,
    "lunarlander": 1_000_000,
    "halfcheetah": 1_000_000,
    "hopper": 1_000_000,
    "mujoco": 1_000_000,
    "batchppo": 1_000_000,
    "toy": 20_000,
    "minigrid": 500_000,
    "toytext": 200_000,
    "pettingzoo": 1_000_000,  # environment steps (a step of every agent of a game)
    "atari": 10_000_000,
    "minatar": 5_000_000,
    "tag-gridworld": 100_000_000,  # agent steps
    "tag-continuous": 100_000_000,
}

# Settings each preset suggests to the runtimes that use them (what a user sets wins): WarpDrive's
# game counts and per-policy learning rates for the Tag games on the device runtime.
RUNTIME_DEFAULTS: dict[str, dict] = {
    "classic": dict(num_actors=2, envs_per_actor=4),
    "toy": dict(num_actors=2, envs_per_actor=2),
    "minigrid": dict(num_actors=2, envs_per_actor=8),
    "toytext": dict(num_actors=2, envs_per_actor=4),
    "pettingzoo": dict(num_actors=2, envs_per_actor=12),  # rows: agents of whole games
    "atari": dict(num_actors=2, envs_per_actor=4),
    "minatar": dict(num_actors=2, envs_per_actor=4),
    "tag-gridworld": dict(num_envs=2000),
    "tag-continuous": dict(
        num_envs=100,
        policy_overrides={"runner": {"learning_rate": 5e-3}, "tagger": {"learning_rate": 1e-3}},
    ),
}
