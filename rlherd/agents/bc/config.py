"""Behaviour cloning's configuration and presets."""

from __future__ import annotations

from dataclasses import dataclass

from rlherd.agents.base import check_at_least_one, check_rates
from rlherd.networks import ObservationConfig

__all__ = ["BCConfig", "PRESETS", "DEFAULT_TOTAL_STEPS"]

LOSSES = ("logp", "mse")


@dataclass
class BCConfig(ObservationConfig):
    """Defaults: Acme's ``BCConfig`` sets the learning rate (Adam, 1e-4) and its examples the
    ``logp`` loss; Acme leaves the batch and the network to the example, and these are the
    CQL and CRR papers' (batches of 256, two hidden layers of 256)."""

    learning_rate: float = 1e-4  # Adam
    batch_size: int = 256  # transitions per learner step, sampled uniformly from the dataset
    # "logp": the dataset actions' negative log-likelihood (categorical, or Gaussian for
    # continuous actions); "mse": squared error of the policy's mean action (continuous only).
    loss: str = "logp"
    hidden_sizes: tuple[int, ...] = (256, 256)  # the MLP torso (vector observations)
    torso: str = "auto"  # mlp, minatar, shallow, deep; auto: from the observation shape

    def __post_init__(self) -> None:
        check_at_least_one(self, "batch_size")
        check_rates(self, "learning_rate")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")


PRESETS: dict[str, dict] = {"classic": {}}
DEFAULT_TOTAL_STEPS = {"classic": 10_000}  # learner steps
