"""CRR's configuration and presets."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import (
    check_at_least_one,
    check_discount,
    check_layers,
    check_positive,
    check_rates,
)

__all__ = ["CRRConfig", "PRESETS", "DEFAULT_TOTAL_STEPS"]

WEIGHTINGS = ("exp", "indicator")


@dataclass
class CRRConfig:
    """Defaults are Acme's CRR (``acme/agents/jax/crr``): Adam at 3e-4 for policy and critic,
    discount 0.99, hard target copies every 100 learner steps, and its policy-weight functions'
    defaults (the advantage against the mean value of 4 sampled actions, ``exp(A / beta)`` with
    beta 1 capped at 20). Batches of 256 and (256, 256) networks are the CRR paper's."""

    learning_rate: float = 3e-4  # Adam, policy and critic
    discount: float = 0.99
    n_step: int = 1  # transitions' length; the critic's target bootstraps after them
    batch_size: int = 256
    target_update_period: int = 100  # learner steps between hard copies into the targets
    num_action_samples: int = 4  # policy samples whose mean Q is the state's value estimate
    # "exp": weights min(exp(A / beta), ratio_upper_bound); "indicator": 1 where A > 0, else 0.
    weighting: str = "exp"
    beta: float = 1.0
    ratio_upper_bound: float = 20.0
    policy_sizes: tuple[int, ...] = (256, 256)  # Gaussian policy torso (LayerNormMLP)
    critic_sizes: tuple[int, ...] = (256, 256)
    policy_init_scale: float = 0.7  # the Gaussian's initial standard deviation
    policy_min_scale: float = 1e-6

    def __post_init__(self) -> None:
        check_layers(self, "policy_sizes", "critic_sizes")
        check_at_least_one(self, "n_step", "batch_size", "target_update_period",
                           "num_action_samples")  # fmt: skip
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, "
                             f"got {self.weighting!r}")  # fmt: skip
        check_rates(self, "learning_rate")
        check_positive(self, "beta", "ratio_upper_bound")
        check_discount(self)


PRESETS: dict[str, dict] = {"classic": {}}
DEFAULT_TOTAL_STEPS = {"classic": 20_000}  # learner steps
