"""MCTS's configuration and presets. Defaults are Acme's (``examples/bsuite/run_mcts.py`` and
``acme/agents/tf/mcts``): 50 simulations, PUCT weight 1, no root noise, discount 0.99, one-step
transitions, batches of 16, one learner step per agent step, replay of 10,000, Adam 1e-3, an MLP
of (50, 50), and a transition model of (50,) when it is learned."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_discount,
    check_non_negative,
    check_positive,
    check_rates,
    check_replay,
)
from rlherd.agents.mcts.search import UNTRIED_VALUES, SearchSettings
from rlherd.networks import ObservationConfig

MODELS = ("simulator", "learned")


@dataclass
class MCTSConfig(ObservationConfig):
    """Search, acting and learning settings (Acme's unless a comment says otherwise)."""

    # Search.
    model: str = "simulator"  # simulator: copies of the environment; learned: an MLP model
    num_simulations: int = 50  # simulations per search (one per agent step and environment)
    puct_c: float = 1.0  # PUCT's exploration weight, in units of return (Acme's ucb_scaling)
    dirichlet_alpha: float = 1.0  # root noise's concentration (AlphaZero: 0.3 chess, 0.03 go)
    dirichlet_fraction: float = 0.0  # root noise's share of the prior (Acme: 0, AlphaZero 0.25)
    untried_value: str = "zero"  # an untried action's Q: zero (Acme's) | parent (the node's value)
    temperature: float = 1.0  # acting samples visits ** (1 / temperature); evaluation: greedy
    two_player: bool = False  # alternating zero-sum games: values negate between players

    # Learning: the value by n-step TD, the policy towards the search's visit distribution.
    discount: float = 0.99
    n_step: int = 1
    batch_size: int = 16
    learning_rate: float = 1e-3
    replay_size: int = 10_000
    min_replay_size: int = 10  # Acme's min_observations
    samples_per_insert: float = 16.0  # one learner step of 16 per agent step (Acme's); inf: none
    samples_per_insert_tolerance: float = 0.1  # error buffer = min_replay_size * spi * tolerance

    # Networks.
    torso: str = "auto"  # auto | mlp | minatar | shallow | deep
    hidden_sizes: tuple[int, ...] = (50, 50)
    model_hidden_sizes: tuple[int, ...] = (50,)  # model=learned's MLPs

    # Acting.
    variable_update_period: int = 1  # actor steps between parameter fetches

    def __post_init__(self) -> None:
        check_replay(self)
        check_at_least_one(self, "num_simulations", "variable_update_period")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.two_player and self.model != "simulator":
            raise ValueError(
                "two-player games are searched with the game itself, which knows the legal moves; "
                "set model=simulator"
            )
        check_discount(self)
        if self.temperature < 0 or not 0.0 <= self.dirichlet_fraction <= 1.0:
            raise ValueError(
                f"temperature must be >= 0 and dirichlet_fraction in [0, 1], got "
                f"{self.temperature} and {self.dirichlet_fraction}"
            )
        if self.untried_value not in UNTRIED_VALUES:
            raise ValueError(f"untried_value must be one of {', '.join(UNTRIED_VALUES)}, got "
                             f"{self.untried_value!r}")  # fmt: skip
        check_non_negative(self, "puct_c")
        check_positive(self, "dirichlet_alpha")
        check_rates(self, "learning_rate")

    @property
    def signed_discount(self) -> float:
        """The discount the search and the adder use: negated in two-player games, so that each
        reward counts for the player who moved and against the other (negamax)."""
        return -self.discount if self.two_player else self.discount

    def search_settings(self) -> SearchSettings:
        return SearchSettings(
            num_simulations=self.num_simulations,
            discount=self.signed_discount,
            puct_c=self.puct_c,
            dirichlet_alpha=self.dirichlet_alpha,
            dirichlet_fraction=self.dirichlet_fraction,
            untried_value=self.untried_value,
        )


PRESETS: dict[str, dict] = {
    # bsuite-like toys (DeepSea, the corridor): Acme's settings as they are.
    "toy": {},
    # bsuite: Acme's bsuite MCTS (examples/bsuite/run_mcts.py), with the simulator model (the
    # Acme paper's Figure 10: "MCTS has access to a perfect simulator").
    "bsuite": {},
    # CartPole and friends. Returns reach 1 / (1 - discount) = 100, and the exploration weight
    # is scaled to them (at Acme's 1 the search never tries a second action). With Acme's
    # bsuite network and learner the value stayed at half the true returns and the cart drifted
    # out at ~170 steps; 10-step returns, a (128, 128) network and two learner steps of 64 per
    # agent step (the search costs far more) learn it (seed 1: 500 at 4,000 steps).
    "classic": dict(
        puct_c=100.0,
        n_step=10,
        hidden_sizes=(128, 128),
        batch_size=64,
        samples_per_insert=128.0,
    ),
    # OpenSpiel's board games by self-play, with OpenSpiel's AlphaZero settings
    # (open_spiel/python/algorithms/alpha_zero): UCT c = 2, root noise Dirichlet(1) at 25%, no
    # discount; a wider network and larger batches than Acme's bsuite ones.
    "openspiel": dict(
        two_player=True,
        discount=1.0,
        puct_c=2.0,
        dirichlet_alpha=1.0,
        dirichlet_fraction=0.25,
        hidden_sizes=(128, 128),
        batch_size=64,
        samples_per_insert=64.0,
        replay_size=50_000,
        min_replay_size=500,
    ),
}

DEFAULT_TOTAL_STEPS: dict[str, int] = {"toy": 10_000, "classic": 20_000, "openspiel": 30_000}

# Searches of several environments share each network call (see benchmarks/mcts_throughput.py).
RUNTIME_DEFAULTS: dict[str, dict] = {
    "toy": dict(num_envs=4, num_actors=2, envs_per_actor=2),
    "classic": dict(num_envs=8, num_actors=2, envs_per_actor=4),
    "openspiel": dict(num_envs=8, num_actors=2, envs_per_actor=4),
}
