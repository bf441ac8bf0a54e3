"""The errors every layer raises. They sit at the bottom of the layers so that an environment, a
network or a replay table can raise the same error the CLI turns into one line
(``rlherd: error: ...``), without importing anything above it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value or override; the message says how to fix it."""


class MissingExtra(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


class UnsupportedEnv(ConfigError, TypeError):
    """An environment rlherd cannot drive as given (its spaces, its options)."""


class TrainingDiverged(ValueError):
    """A learner blew up: a step produced a non-finite loss, gradient or parameter, or its
    parameters or losses grew far beyond their early size (:mod:`rlherd.run.divergence`). The
    run stops there, and no checkpoint holds the blown-up values."""

    HINT = (
        "training diverged; a learning rate too high for the task is the usual cause (lower it "
        "with --set learning_rate=..., or clip gradients where the agent can: grad_norm_clip, "
        "max_grad_norm). The latest checkpoint, if any, is the last good one"
    )


class NodeDied(RuntimeError):
    """A node of a distributed program that the run cannot go on without (learner, replay,
    counter) is gone; the message names it and how to continue."""
