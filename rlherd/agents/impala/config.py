"""IMPALA's configuration: TorchBeast's Atari defaults, and presets for small tasks."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImpalaConfig:
    """Defaults are TorchBeast's for Atari (``polybeast``/``monobeast`` flags).

    ``batch_size`` counts environment trajectories per learner step and ``unroll_length`` is ``T``.
    The ``single`` runtime steps ``batch_size`` environments, so each rollout is one batch; in
    ``mono`` each actor process steps ``envs_per_actor`` environments into one shared slot, and the
    learner joins ``batch_size / envs_per_actor`` slots.
    """

    # Learning (TorchBeast defaults).
    unroll_length: int = 80
    batch_size: int = 8
    discount: float = 0.99
    reward_clip: float | None = 1.0  # rewards clipped to [-clip, clip] in the learner; None: off
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
    torso: str = "auto"  # auto | mlp | shallow | deep | minatar
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP torso
    use_lstm: bool = False
    lstm_size: int = 256

    # Acting.
    envs_per_actor: int = 8  # mono: environments each actor process steps
    num_actors: int = 4  # mono: actor processes
    num_buffers: int = 0  # mono: shared rollout slots; 0 = max(2 * num_actors, 2 * batches)
    num_learner_threads: int = 1  # mono
    native_vector_env: bool = True  # Atari through ale-py's AtariVectorEnv
    env_workers: int = 0  # single: step environments in this many BatchEnv processes (0: here)

    # poly: environment servers. num_servers local ones (Unix sockets), unless env_servers lists
    # addresses ("host:port,unix:/path,...") of servers already running.
    num_servers: int = 2
    env_servers: str = ""
    inference_min_batch: int = 1  # rows the dynamic batcher waits for (up to the timeout)
    inference_timeout_ms: float = 100.0
    stall_timeout_s: float = 120.0  # stop if no rollout arrives for this long

    # Where the learner's network lives ("cpu", "cuda", "cuda:1"); mono actors always act on CPU.
    device: str = "cpu"
    # Intra-op threads of the learner process. Small models gain nothing from more, and threads
    # beyond the free cores make every op wait for a descheduled one (10x slower seen here).
    torch_threads: int = 1

    # Runs.
    checkpoint_interval_s: float = 600.0
    log_interval_s: float = 5.0

    def __post_init__(self) -> None:
        positive = (
            "unroll_length", "batch_size", "envs_per_actor", "num_actors", "lstm_size",
            "num_servers", "inference_min_batch",
        )  # fmt: skip
        for name in (*positive, "num_learner_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {self.discount}")
        if self.optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"optimizer must be 'rmsprop' or 'adam', got {self.optimizer!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but CUDA is not available; use device=cpu")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


PRESETS: dict[str, dict] = {
    # TorchBeast's Atari settings need nothing beyond the defaults.
    "atari": {},
    # Vector-observation control tasks (CartPole, Acrobot, ...): short unrolls, Adam, more
    # exploration, frequent updates. Reaches 500 on CartPole-v1 within 500k steps (seeds 0, 1).
    "classic": dict(
        unroll_length=10,
        batch_size=16,
        envs_per_actor=8,
        num_actors=2,
        reward_clip=None,
        entropy_cost=0.01,
        optimizer="adam",
        learning_rate=2e-3,
        grad_norm_clip=40.0,
        hidden_sizes=(64, 64),
    ),
    # MinAtar: the paper's small network, Atari-like learning settings.
    "minatar": dict(unroll_length=20, batch_size=16, envs_per_actor=8, entropy_cost=0.01),
    # rlherd's tiny test environments.
    "toy": dict(
        unroll_length=8,
        batch_size=8,
        envs_per_actor=4,
        num_actors=2,
        reward_clip=None,
        entropy_cost=0.01,
        optimizer="adam",
        learning_rate=3e-3,
        hidden_sizes=(32,),
    ),
}


# How long a run lasts unless --total-steps says otherwise, per preset (agent steps).
DEFAULT_TOTAL_STEPS: dict[str, int] = {
    "atari": 50_000_000,
    "classic": 500_000,
    "minatar": 5_000_000,
    "toy": 20_000,
}
