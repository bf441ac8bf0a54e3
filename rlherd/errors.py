"""The errors every layer raises. They sit at the bottom of the layers so that an environment, a
network or a replay table can raise the same error the CLI turns into one line
(``rlherd: error: ...``), without importing anything above it."""

from __future__ import annotations

import signal
import warnings


class ConfigError(ValueError):
    """A bad config value or override; the message says how to fix it."""


class MissingExtra(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


class NeedsInput(ConfigError):
    """A run needs data only its user can name (a dataset to learn from, demonstrations of an
    environment without a scripted expert); ``flag`` is the flag that names it, with which
    ``rlherd check-env`` says the agent trains the environment."""

    def __init__(self, message: str, flag: str):
        super().__init__(message)
        self.flag = flag

    def __reduce__(self) -> tuple:  # raised in a worker process or Ray node, it travels whole
        return type(self), (str(self), self.flag)


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


def not_a_count(what: str, least: int, value: object) -> str:
    """The line for an option that must be a count: JSON and YAML write ``2.0`` for a float, which
    a reader takes for the whole number it is, so that case says what to write instead."""
    hint = f" (write {int(value)})" if isinstance(value, float) and value.is_integer() else ""
    return f"{what} must be a whole number >= {least}, got {value!r}{hint}"


class Notice(UserWarning):
    """Something a run's user should know that does not stop it (a leaf left out of the
    observation, a snapshot not loaded, a tracker that could not log). The ``rlherd`` command
    prints each as the one line it is; from Python it is a warning, to filter by this class."""


_python_format = warnings.formatwarning


def one_line(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    """``warnings.formatwarning`` for the rlherd command and its worker processes: rlherd's
    notices as the one line they are at a terminal, since where in rlherd's code one was raised,
    and that line of code, say nothing to the person who reads it. Other packages' warnings keep
    Python's form, which points at their source."""
    if issubclass(category, Notice):
        return f"rlherd: {message}\n"
    return _python_format(message, category, filename, lineno, line)


class Stalled(RuntimeError):
    """Nothing the learner needs arrived for the run's stall timeout (its environment servers
    are out of reach); the message names them, their last errors and how to continue."""


class NodeDied(RuntimeError):
    """A node of a distributed program that the run cannot go on without (learner, replay,
    counter) is gone; the message names it and how to continue."""


def exit_status(code: int | None) -> str:
    """How a child process ended, in words, for the line that reports it: ``exit code 1``, or,
    for the negative codes with which ``multiprocessing`` and ``subprocess`` name the signal
    that ended a process, ``killed by SIGKILL (out of memory? ...)``: the kernel's out-of-memory
    killer sends SIGKILL unasked, and "exit code -9" says neither."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:  # a real-time signal has no name of its own
        name = f"signal {-code}"
    hint = " (out of memory? the kernel's OOM killer sends it)" if name == "SIGKILL" else ""
    return f"killed by {name}{hint}"
