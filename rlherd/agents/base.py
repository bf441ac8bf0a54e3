"""What every agent's builder shares: its config, presets and defaults, and which dataflow it
uses. Runtimes reach agents only through the builder methods of :mod:`rlherd.core`."""

from __future__ import annotations

import math
import typing
from typing import Any

from rlherd import envs as rl_envs
from rlherd.agents.acting import TransitionActor
from rlherd.core import EnvSpec
from rlherd.errors import ConfigError
from rlherd.replay import (
    BatchAdder,
    Fifo,
    MinSize,
    NStepTransitionAdder,
    RateLimiter,
    ReplayDataset,
    SampleToInsertRatio,
    Table,
    Uniform,
)
from rlherd.replay.selectors import Selector

SAMPLE_TIMEOUT_S = 1.0  # a learner waiting on the rate limiter wakes this often (runtimes retry)


def check_at_least_one(config: Any, *names: str) -> None:
    """Counts and sizes a config cannot run with below 1."""
    for name in names:
        if not getattr(config, name) >= 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")


def check_positive(config: Any, *names: str) -> None:
    """Learning rates, averaging rates, clips: above 0 (NaN is not; an infinite clip is no
    clip), or None where the field's type allows it (``float | None``: a rate of its own left
    out, a clip turned off)."""
    hints = typing.get_type_hints(type(config))
    for name in names:
        value = getattr(config, name)
        optional = type(None) in typing.get_args(hints[name])
        if value is None and optional:
            continue
        if value is None or not value > 0:
            off = " (None turns it off)" if optional else ""
            raise ValueError(f"{name} must be > 0{off}, got {value}")


def check_rates(config: Any, *names: str) -> None:
    """Learning rates: :func:`check_positive`'s, and finite, which a clip need not be: one
    optimiser step at an infinite rate leaves NaN in every parameter it moves, which shows
    only later, as an error from inside the policy's distribution or as a run that learns
    nothing."""
    check_positive(config, *names)
    for name in names:
        value = getattr(config, name)
        if value is not None and math.isinf(value):
            raise ValueError(f"{name} must be finite, got {value}")


def check_non_negative(config: Any, *names: str) -> None:
    """Counts and scales that may be 0 (off), never below (nor NaN)."""
    for name in names:
        if not getattr(config, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)}")


def check_layers(config: Any, *names: str) -> None:
    """Hidden-layer widths of the continuous-control networks: at least one layer, since their
    torsos normalise or activate a hidden layer and their heads read its width, so an empty
    tuple is refused here, by name, not by the network's constructor at the run's start. Each
    width's own bound (1 or more) is :func:`rlherd.config.apply_overrides`'s."""
    for name in names:
        if not getattr(config, name):
            raise ValueError(f"{name} must name at least one hidden layer, e.g. (256, 256); "
                             f"got {getattr(config, name)!r}")  # fmt: skip


def check_temperature(config: Any) -> None:
    """SAC's temperature (SAC's and CQL's configs): a fixed ``entropy_coefficient`` at least 0
    and finite, and a finite ``target_entropy`` for a tuned one (None: tuned, and minus the
    action dimension). An infinite one is no setting of either: the first update would leave
    NaN in the networks, found only as an error from inside the policy's distribution."""
    alpha, target = config.entropy_coefficient, config.target_entropy
    if alpha is not None and not 0 <= alpha < math.inf:
        raise ValueError(f"entropy_coefficient must be >= 0 and finite (or None: tuned), "
                         f"got {alpha}")  # fmt: skip
    if target is not None and not math.isfinite(target):
        raise ValueError(f"target_entropy must be finite (or None: minus the action dimension), "
                         f"got {target}")  # fmt: skip


def check_discount(config: Any) -> None:
    """A discount in [0, 1] (NaN is not): the one check every agent's config makes of it."""
    if not 0.0 <= config.discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {config.discount}")


def check_replay(config: Any) -> None:
    """The fields :class:`TransitionReplayBuilder` reads. A negative tolerance would be taken
    silently as the smallest error buffer the rate limiter allows, so it is refused."""
    check_at_least_one(config, "n_step", "batch_size", "replay_size", "min_replay_size")
    check_non_negative(config, "samples_per_insert_tolerance")
    if config.min_replay_size > config.replay_size:
        raise ValueError(
            f"min_replay_size ({config.min_replay_size}) exceeds replay_size "
            f"({config.replay_size}): sampling would never start"
        )
    if not config.samples_per_insert > 0:  # NaN too
        raise ValueError(
            f"samples_per_insert must be > 0 (inf: no rate limit), got {config.samples_per_insert}"
        )


def check_critic(config: Any) -> None:
    """Learning rates and clipping thresholds above 0 (or None where None turns them off), a
    discount in [0, 1] (below 1 for a derived support, which divides by ``1 - discount``), and
    a categorical critic's support: ``vmin`` and ``vmax`` both set or both derived, in order,
    2+ atoms."""
    check_rates(config, "learning_rate", "critic_learning_rate")
    check_positive(config, "grad_norm_clip")
    check_discount(config)
    if config.distributional and config.vmin is None and config.discount == 1.0:
        raise ValueError("a derived support needs discount < 1; set vmin and vmax")
    if (config.vmin is None) != (config.vmax is None):
        raise ValueError("set both vmin and vmax, or neither (derived from the rewards)")
    if config.vmin is not None and not config.vmin < config.vmax:
        raise ValueError(f"vmin ({config.vmin}) must be below vmax ({config.vmax})")
    if config.distributional and config.num_atoms < 2:
        raise ValueError(f"a categorical critic needs num_atoms >= 2, got {config.num_atoms}")


class AgentBuilder:
    """Subclasses set ``name``, ``config_class``, ``presets`` (config fields per preset),
    ``default_total_steps`` (per preset), ``dataflow`` (``"replay"`` or ``"rollout"``) and
    ``runtime_defaults`` (per preset: settings this agent suggests to whichever runtime uses
    them, e.g. ``num_actors``; what a user sets wins) and ``needs``, the runtime capabilities
    it runs with (:data:`rlherd.runtime.CAPABILITIES`: its dataflow, and more where it needs
    them, saying why in ``why_not``), and add the ``make_*`` methods of
    :class:`rlherd.core.ReplayBuilder` or :class:`rlherd.core.RolloutBuilder`. It runs on every
    runtime that provides what it needs, an outside package's included."""

    name: str
    config_class: type
    presets: dict[str, dict[str, Any]]
    default_total_steps: dict[str, int]
    dataflow: str
    runtime_defaults: dict[str, dict[str, Any]] = {}
    needs: frozenset[str]  # runtime capabilities: its dataflow, and more where said why
    why_not: str = ""  # why it needs more than its dataflow (a refused user reads it)

    @classmethod
    def preset_for(cls, env_id: str) -> str:
        """The preset an env id gets unless one is named: its family's (atari, minatar, toy,
        ...), or ``classic`` where the agent has none for that family."""
        family = rl_envs.family(env_id)
        return family if family in cls.presets else "classic"

    def __init__(self, config: Any):
        self.config = config

    def check_environments(self, spec: EnvSpec, envs: Any) -> None:
        """Raise :class:`~rlherd.errors.ConfigError` where this agent cannot train ``envs``
        (a vector of them, as the ``single`` runtime steps, whose spec is ``spec``) for a reason
        their spec does not show, so ``rlherd check-env`` says so before a run does. Most agents
        read only the spec: MCTS's simulator also copies the environments."""


class RolloutAgentBuilder(AgentBuilder):
    """On-policy agents: learner batches are ``batch_size`` rollouts of ``unroll_length``."""

    dataflow = "rollout"
    needs = frozenset({"rollout"})

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


class TransitionReplayBuilder(AgentBuilder):
    """Replay agents that learn from n-step transitions (DQN, DDPG, D4PG, MPO, DMPO): one table
    sampled uniformly (unless :meth:`sampler` says otherwise), paced by Acme's samples-per-insert
    limiter (unless :meth:`rate_limiter` does), written by one n-step adder per environment.

    The config has ``discount``, ``n_step``, ``batch_size``, ``replay_size``, ``min_replay_size``,
    ``samples_per_insert`` and ``samples_per_insert_tolerance``."""

    dataflow = "replay"
    needs = frozenset({"replay"})

    def rate_limiter(self) -> RateLimiter:
        """Acme's ``SampleToInsertRatio``: each transition is sampled ``samples_per_insert``
        times on average once ``min_replay_size`` are in, within an error buffer of
        ``min_replay_size * samples_per_insert * tolerance`` samples.

        ``samples_per_insert=inf`` is Acme's ``MinSize``: once ``min_replay_size`` items are in,
        the learner samples as fast as it can and actors never wait for it (the "unlimited"
        ratio of the Acme paper's rate-limiter study)."""
        c = self.config
        if math.isinf(c.samples_per_insert):
            return MinSize(c.min_replay_size)
        error_buffer = max(
            c.min_replay_size * c.samples_per_insert * c.samples_per_insert_tolerance,
            2 * max(1.0, c.samples_per_insert),
        )
        return SampleToInsertRatio(c.samples_per_insert, c.min_replay_size, error_buffer)

    def sampler(self) -> Selector:
        return Uniform()

    def extras_signature(self, spec: EnvSpec) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Fields the actor stores with each transition beyond the standard ones (MCTS's search
        policy); none here."""
        return {}

    def item_signature(self, spec: EnvSpec) -> dict[str, tuple[tuple[int, ...], Any]]:
        """What one replay item holds: an n-step transition and its extras here; R2D2's
        builder stores sequences instead, written by its own adder."""
        return NStepTransitionAdder.signature(spec, self.extras_signature(spec))

    def make_replay_tables(
        self, spec: EnvSpec, insert_blocking: bool = True, dataset_size: int | None = None
    ) -> list[Table]:
        """One table of n-step transitions. In one process (``insert_blocking=False``) inserts
        never wait and the learner steps whenever the rate limiter lets it sample. Holding a
        fixed dataset (``dataset_size``), it has room for all of it and no rate limit."""
        if dataset_size is not None:
            size, limiter = max(1, dataset_size), MinSize(1)
        else:
            size, limiter = self.config.replay_size, self.rate_limiter()
        if not insert_blocking:
            if dataset_size is None and math.isinf(self.config.samples_per_insert):
                raise ConfigError(
                    "samples_per_insert=inf (no rate limit) lets the learner step without end "
                    "where it takes turns with the actors in one loop: run it with actors "
                    "apart (--runtime mono, poly or distributed), or give a finite ratio"
                )
            limiter = limiter.without_insert_blocking()
        # Frames are kept compressed: a million Atari transitions are 53 GiB as arrays.
        signature = self.item_signature(spec)
        return [Table("replay", signature, size, self.sampler(), Fifo(), 0, limiter,
                      compress=True)]  # fmt: skip

    def make_dataset(self, tables: list[Table], device: str = "cpu") -> ReplayDataset:
        return ReplayDataset(tables[0], self.config.batch_size, device, timeout=SAMPLE_TIMEOUT_S)

    def make_adder(self, tables: list[Table], num_envs: int) -> BatchAdder:
        c = self.config
        return BatchAdder(
            [NStepTransitionAdder(tables[0], c.n_step, c.discount) for _ in range(num_envs)]
        )


class OfflineBuilder(TransitionReplayBuilder):
    """Agents that learn from a fixed dataset and nothing else (BC, CQL, CRR): the offline
    runtime fills their table, and their actor only acts, for the evaluator, with the
    parameters it fetches before every step."""

    needs = frozenset({"replay", "dataset"})
    why_not = (
        "it learns from a fixed dataset only: pass --dataset ID (a Minari dataset; `rlherd "
        "collect RUN --episodes N --out ID` records one)"
    )

    def make_actor(
        self,
        seed: int,
        policy: Any,
        spec: EnvSpec,
        adder: BatchAdder | None,
        variable_source: Any,
    ) -> TransitionActor:
        return TransitionActor.build(policy, adder, seed, variable_source, 1)
