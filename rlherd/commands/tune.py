"""``rlherd tune``: hyperparameter sweeps with Optuna.

A study trains one agent on one environment many times (its *trials*), each time with values of
the agent's config fields drawn from a *search space*, and keeps the config whose evaluations
were best. Optuna's TPE sampler draws the values (at random for the first ``startup_trials``,
then from a model of what scored well), and its median pruner stops a trial whose evaluations
fall below the median of the finished trials' at the same point.

- The space is plain data: config field -> a distribution (:data:`KINDS`). Each agent that has
  one (:data:`SPACES`) says where it comes from beside it: RL Zoo's ``hyperparams_opt.py`` where
  RL Zoo tunes the same algorithm, mapped onto rlherd's field names. ``--space FILE`` replaces
  or adds fields (and a field set to ``null`` leaves the search).
- Every trial is an ordinary run directory (``STUDY_DIR/trial-<n>/``): ``rlherd eval``,
  ``plot`` and ``train --resume`` work on it. Its evaluations reach Optuna through a callback
  (:class:`ReportEvaluations`); a pruned trial is a run its callback stopped, so its summary
  says why (``stopped_by``).
- A trial's value is the area under its evaluation curve (the mean of its evaluations' mean
  returns), which rewards a config that reaches a score sooner, not only one that ends there;
  ``objective="final"`` takes the last evaluation instead.
- ``jobs`` worker processes share the study through its storage (an SQLite file by default), as
  Optuna's own parallel optimisation does across machines; each trial keeps to one torch thread.
- The study writes ``best.yaml`` (a ``rlherd train --config`` file), ``trials.csv`` and Optuna's
  parameter-importance plot, ``importance.png``. Running the command again with the same
  storage continues the study.

The command's parser lives in :mod:`rlherd.cli`, which imports this module only to run a study
(``rlherd --help`` stays fast); Optuna is imported when a study starts, so that without it the
command is one line naming the extra.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import json
import math
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import default_run_dir, default_runtime, resolve_config, train
from rlherd.config import check_seed, to_json
from rlherd.errors import ConfigError, TrainingDiverged, exit_status, one_line
from rlherd.run.callbacks import STOP, Callback, RunInfo
from rlherd.run.rundir import make_folder
from rlherd.runtime import settings as settings_mod

# A distribution: (kind, low, high) or ("categorical", [choices]). The two last kinds draw a
# number Optuna sees under another name and turn it into the field's value, as RL Zoo does:
# - "log_one_minus": Optuna draws x = 1 - value log-uniformly in [low, high] (named
#   "one_minus_<field>"): discounts and GAE lambdas, whose effect lives in 1 - value;
# - "run_fraction": Optuna draws x uniformly in [low, high] (named "<field>_fraction"), and the
#   field is x times the run's steps (at least 1): schedules that scale with the budget.
KINDS = ("float", "log_float", "int", "log_int", "categorical", "log_one_minus", "run_fraction")
Distribution = tuple

# Where RL Zoo's samplers (DLR-RM/rl-baselines3-zoo, rl_zoo3/hyperparams_opt.py) use SB3's
# names, rlherd's fields are named here; what rlherd's agent does not have is left out, and
# where rlherd counts something differently, the comment says how the range was carried over.
SPACES: dict[str, dict[str, Distribution]] = {
    # RL Zoo's sample_ppo_params. SB3's n_steps (steps per environment per update) is
    # unroll_length, its n_epochs epochs, clip_range clip, ent_coef entropy_cost, max_grad_norm
    # max_grad_norm, net_arch tiny/small/medium hidden_sizes (policy and value alike), and
    # activation_fn activation. SB3 samples the minibatch's rows (32-512); rlherd's PPO takes
    # the number of minibatches per epoch, searched over counts that span such sizes at the
    # CartPole preset's 8 x 32 rollouts up to 8 x 2048. The number of environments
    # (batch_size here) is RL Zoo's per-env setting, not sampled: the preset's stays, as does
    # the preset's learning-rate annealing (RL Zoo samples a constant rate).
    "ppo": {
        "unroll_length": ("categorical", [32, 64, 128, 256, 512, 1024, 2048]),
        "minibatches": ("categorical", [1, 2, 4, 8, 16, 32, 64]),
        "discount": ("log_one_minus", 1e-4, 0.03),
        "gae_lambda": ("log_one_minus", 1e-4, 0.1),
        "learning_rate": ("log_float", 1e-5, 2e-3),
        "entropy_cost": ("log_float", 1e-8, 0.1),
        "clip": ("categorical", [0.1, 0.2, 0.3, 0.4]),
        "epochs": ("categorical", [1, 5, 10, 20]),
        "max_grad_norm": ("float", 0.3, 2.0),
        "hidden_sizes": ("categorical", ["64", "64 64", "256 256"]),
        "activation": ("categorical", ["tanh", "relu"]),
    },
    # RL Zoo's sample_dqn_params. SB3's gamma is discount, buffer_size replay_size,
    # learning_starts min_replay_size (without RL Zoo's 0: rlherd samples from at least one
    # transition), exploration_final_eps epsilon_end, exploration_fraction epsilon_decay_steps as
    # a fraction of the run, target_update_interval target_update_period (SB3 counts it in
    # environment steps, rlherd in learner steps; RL Zoo's values are kept), net_arch
    # hidden_sizes. SB3 trains gradient_steps = train_freq / subsample_steps times every
    # train_freq steps, a replay ratio of batch_size / subsample_steps samples per insert:
    # rlherd paces its learner by that ratio (samples_per_insert), searched over the ratios
    # RL Zoo's space spans (16 / 8 to 512 / 1). rlherd's DQN extras (n-step returns, double Q,
    # dueling, prioritised replay) are SB3's plain DQN in RL Zoo, and stay at the preset's.
    "dqn": {
        "discount": ("categorical", [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999]),
        "learning_rate": ("log_float", 1e-5, 1.0),
        "batch_size": ("categorical", [16, 32, 64, 100, 128, 256, 512]),
        "replay_size": ("categorical", [10_000, 50_000, 100_000, 1_000_000]),
        "epsilon_end": ("float", 0.0, 0.2),
        "epsilon_decay_steps": ("run_fraction", 0.0, 0.5),
        "target_update_period": ("categorical", [1, 1000, 5000, 10000, 15000, 20000]),
        "min_replay_size": ("categorical", [1000, 5000, 10000, 20000]),
        "samples_per_insert": ("categorical", [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        "hidden_sizes": ("categorical", ["64", "64 64", "256 256"]),
    },
    # RL Zoo has no IMPALA sampler; its A2C's (sample_a2c_params: an actor-critic with an
    # entropy bonus, like IMPALA without V-trace) gives the discount, entropy_cost (ent_coef)
    # and hidden_sizes (net_arch small/medium). Its learning rates (1e-5 to 2e-3) are widened
    # to 1e-2: rlherd's MinAtar preset found 6e-3 best (rlherd/agents/impala/config.py). A2C's
    # n_steps and max_grad_norm do not carry over: IMPALA's unrolls are TorchBeast's length
    # (80) down to the classic preset's (10), searched here as rlherd's own choice with the
    # batch of rollouts per update, and its losses are sums over the batch (TorchBeast's), so
    # A2C's clip of a mean loss's gradient is no scale for grad_norm_clip (left at the preset's).
    "impala": {
        "discount": ("log_one_minus", 1e-4, 0.03),
        "learning_rate": ("log_float", 1e-5, 1e-2),
        "entropy_cost": ("log_float", 1e-8, 0.1),
        "hidden_sizes": ("categorical", ["64 64", "256 256"]),
        "unroll_length": ("categorical", [5, 10, 20, 40, 80]),
        "batch_size": ("categorical", [8, 16, 32]),
    },
}

OBJECTIVES = ("auc", "final")
GRACE_S = 60.0  # how long interrupted workers may take to close their runs before being killed


@dataclass
class Plan:
    """Everything a worker needs to run its share of the trials (sent to worker processes, so
    plain data)."""

    agent: str
    env: str
    space: dict[str, Distribution]
    fixed: dict[str, str]  # --set: agent fields and runtime settings, as strings
    total_steps: int
    eval_every: int
    eval_episodes: int
    objective: str
    seed: int
    startup_trials: int
    warmup_evals: int
    study_dir: str
    storage: str
    study_name: str
    # What the study was made for, kept in its storage: a continued study must match.
    terms: dict[str, Any] = field(default_factory=dict)


def tune(agent: str, env: str, *, trials: int, jobs: int = 1, storage: str | None = None,
         study_name: str | None = None, space: str | Path | None = None,
         total_steps: int | None = None, eval_every: int | None = None, eval_episodes: int = 5,
         objective: str = "auc", seed: int = 0, startup_trials: int = 5,
         warmup_evals: int | None = None, out: str | Path | None = None,
         fixed: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``trials`` trials of ``agent`` on ``env`` in ``jobs`` processes, then write the study's
    outputs and return its summary (best value and config, paths, trial counts). The Python
    form of ``rlherd tune``; see the module's docstring."""
    optuna = _import_optuna()
    plan = _plan(agent, env, trials, jobs, storage, study_name, space, total_steps, eval_every,
                 eval_episodes, objective, seed, startup_trials, warmup_evals, out,
                 fixed or {})  # fmt: skip
    _open_study(optuna, plan)
    jobs = min(jobs, trials)
    print(f"rlherd tune: study {plan.study_name!r} in {plan.study_dir}: {trials} trials of "
          f"{plan.total_steps} steps on {jobs} worker(s); searching "
          f"{', '.join(plan.space) or 'nothing'}"
          + (f"; fixed {', '.join(plan.fixed)}" if plan.fixed else ""),
          file=sys.stderr, flush=True)  # fmt: skip
    shares = [trials // jobs + (i < trials % jobs) for i in range(jobs)]
    interrupted = False
    try:
        if jobs == 1:
            _work(plan, 0, shares[0])
        else:
            _run_workers(plan, shares)
    except KeyboardInterrupt:
        interrupted = True
        print("rlherd tune: interrupted; run the same command again to continue the study",
              file=sys.stderr)  # fmt: skip
    finally:
        summary = write_outputs(optuna, plan)
    return {**summary, "interrupted": interrupted}


def _import_optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("rlherd tune needs Optuna: pip install 'rlherd[tune]'") from None
    # rlherd prints a line per trial, and reports interruptions and errors itself.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna


def _plan(agent, env, trials, jobs, storage, study_name, space, total_steps, eval_every,
          eval_episodes, objective, seed, startup_trials, warmup_evals, out,
          fixed) -> Plan:  # fmt: skip
    """Check every argument before any trial starts, and fill in the defaults."""
    counts = {"--trials": (trials, 1), "--jobs": (jobs, 1), "--eval-episodes": (eval_episodes, 1),
              "--startup-trials": (startup_trials, 0), "--warmup-evals": (warmup_evals, 0)}
    bad = [f"{flag} must be >= {least}, got {value}" for flag, (value, least) in counts.items()
           if value is not None and value < least]  # warmup_evals None: a third of the budget
    if bad:
        raise ConfigError("; ".join(bad))
    check_seed(seed)
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if agent not in BUILDERS:
        raise ConfigError(f"unknown agent {agent!r}; available: {', '.join(sorted(BUILDERS))}")
    env = rl_envs.resolve(env)
    fields = _config_fields(agent)
    unknown = sorted(set(fixed) - fields - set(settings_mod.all_fields()))
    if unknown:
        raise ConfigError(f"--set {unknown[0]}: neither a field of {agent}'s config nor a runtime "
                          f"setting (see rlherd/agents/{agent}/config.py and rlherd train --help)")
    agent_fixed = {k: v for k, v in fixed.items() if k in fields}
    _, preset = resolve_config(agent, env, None, agent_fixed)
    runtime_fixed = {k: v for k, v in fixed.items() if k not in fields}
    settings_mod.resolve(default_runtime(agent, env, runtime_fixed), {}, runtime_fixed,
                         BUILDERS[agent].dataflow)  # fmt: skip
    searched = {k: v for k, v in load_space(agent, space).items() if k not in fixed}
    if total_steps is None:  # 0 is refused below, as train refuses it, not taken for unset
        total_steps = BUILDERS[agent].default_total_steps[preset]
    if total_steps < 1:
        raise ConfigError(f"--total-steps must be >= 1, got {total_steps}")
    eval_every = eval_every or max(1, total_steps // 10)
    if not 0 < eval_every <= total_steps:
        raise ConfigError(f"--eval-every ({eval_every}) must be in 1..--total-steps "
                          f"({total_steps}): trials are judged by their evaluations")  # fmt: skip
    evaluations = total_steps // eval_every
    if out is None:
        run_dir = default_run_dir(agent, env)  # runs/AGENT-ENV-TIME
        out = run_dir.with_name(f"tune-{run_dir.name}")
    study_dir = make_folder(Path(out), "--out")
    return Plan(agent=agent, env=env, space=searched, fixed=fixed, total_steps=total_steps,
                eval_every=eval_every, eval_episodes=eval_episodes, objective=objective,
                seed=seed, startup_trials=startup_trials,
                warmup_evals=evaluations // 3 if warmup_evals is None else warmup_evals,
                study_dir=str(study_dir.resolve()),
                storage=storage or f"sqlite:///{study_dir.resolve() / 'study.db'}",
                study_name=study_name or f"{agent}-{env.split(':')[-1].replace('/', '_')}",
                terms=dict(agent=agent, env=env, total_steps=total_steps, eval_every=eval_every,
                           eval_episodes=eval_episodes, objective=objective))  # fmt: skip


def load_space(agent: str, path: str | Path | None = None) -> dict[str, Distribution]:
    """The agent's search space (:data:`SPACES`), with the fields of the YAML file at ``path``
    replacing or adding to it (``null`` drops one). Every field must be one of the agent's
    config and every distribution well formed: one line otherwise."""
    if agent not in SPACES and path is None:
        raise ConfigError(f"no search space for {agent}; rlherd has spaces for "
                          f"{', '.join(sorted(SPACES))}: give one with --space FILE")  # fmt: skip
    space = dict(SPACES.get(agent, {}))
    where = "rlherd.commands.tune.SPACES"
    if path is not None:
        space.update(_read_space_file(Path(path)))
        where = f"--space {path}"
    space = {k: v for k, v in space.items() if v is not None}
    config_class = BUILDERS[agent].config_class
    fields = sorted(config_class.__dataclass_fields__)
    for name, distribution in space.items():
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: {name!r} is not a field of {config_class.__name__}"
                              f"{hint}; see rlherd/agents/{agent}/config.py")  # fmt: skip
        space[name] = _checked(name, distribution, where)
    return space


def _read_space_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--space {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--space {path} must map fields to [kind, low, high] or "
                          "[categorical, [choices]]")  # fmt: skip
    return data


def _checked(name: str, distribution: Any, where: str) -> Distribution:
    """``distribution`` as a tuple with numeric bounds (YAML reads ``1e-5`` as a string), or a
    one-line error showing the forms it may take."""
    kinds = ", ".join(k for k in KINDS if k != "categorical")
    forms = f"write {name}: [KIND, LOW, HIGH] (KIND one of {kinds}) or [categorical, [CHOICES]]"
    if not isinstance(distribution, list | tuple) or not distribution:
        raise ConfigError(f"{where}: {forms}")
    kind, *rest = distribution
    if kind == "categorical":
        if len(rest) != 1 or not isinstance(rest[0], list | tuple) or not rest[0]:
            raise ConfigError(f"{where}: {forms}")
        # inf is a choice (samples_per_insert=inf: no rate limit); NaN means nothing
        if not all(v is None or isinstance(v, bool | int | str)
                   or isinstance(v, float) and not math.isnan(v) for v in rest[0]):  # fmt: skip
            raise ConfigError(f"{where}: {name}'s choices must be numbers (not NaN), strings, "
                              "booleans or null (a tuple field as a string: '64 64')")  # fmt: skip
        return ("categorical", list(rest[0]))
    if kind not in KINDS or len(rest) != 2:
        raise ConfigError(f"{where}: {forms}")
    number = int if kind in ("int", "log_int") else float
    try:
        low, high = number(rest[0]), number(rest[1])
    except (TypeError, ValueError, OverflowError):  # int(inf) overflows
        raise ConfigError(f"{where}: {name}'s bounds must be numbers, got {rest}") from None
    if number is int and (low != float(rest[0]) or high != float(rest[1])):  # int(1.5) is 1
        raise ConfigError(f"{where}: {name}'s bounds must be whole numbers for {kind}, got {rest}")
    if not math.isfinite(low) or not math.isfinite(high) or low > high or (
            kind.startswith("log") and low <= 0):  # fmt: skip
        raise ConfigError(f"{where}: {name} needs finite low <= high (and low > 0 for {kind})")
    return (kind, low, high)


def suggest(trial, space: dict[str, Distribution], total_steps: int) -> dict[str, Any]:
    """The config values ``trial`` draws from ``space`` (by Optuna's names for them, see
    :data:`KINDS`)."""
    values: dict[str, Any] = {}
    for name, (kind, *rest) in space.items():
        if kind == "categorical":
            values[name] = trial.suggest_categorical(name, rest[0])
        elif kind in ("float", "log_float"):
            values[name] = trial.suggest_float(name, *rest, log=kind == "log_float")
        elif kind in ("int", "log_int"):
            values[name] = trial.suggest_int(name, *rest, log=kind == "log_int")
        elif kind == "log_one_minus":
            values[name] = 1.0 - trial.suggest_float(f"one_minus_{name}", *rest, log=True)
        else:  # run_fraction
            fraction = trial.suggest_float(f"{name}_fraction", *rest)
            values[name] = max(1, round(fraction * total_steps))
    return values


class ReportEvaluations(Callback):
    """Tells Optuna each evaluation of a trial's run and stops the run when the pruner says so.

    The value reported is the trial's value so far (the mean of its evaluations for ``auc``),
    so the pruner compares what the objective compares. Its step is the evaluation's interval
    (steps // eval_every), the same for every trial however its rollouts fall, for the median
    is taken over the trials' values at the same step; the final policy's evaluation, where
    ``eval_every`` does not divide the budget, takes the next one (Optuna keeps one value per
    step, and would drop it)."""

    def __init__(self, trial, eval_every: int, objective: str):
        self.trial, self.eval_every, self.objective = trial, eval_every, objective
        self.returns: list[float] = []
        self.counts = "actor_steps"
        self.pruned = False
        self.step = -1  # the latest step reported

    def on_start(self, run: RunInfo) -> None:
        self.counts = run.counts

    def on_eval(self, results: dict[str, Any]) -> str | None:
        self.returns.append(float(results["eval_return_mean"]))
        value = self.value()
        step = self.step = max(int(results[self.counts]) // self.eval_every, self.step + 1)
        self.trial.report(value, step)
        if self.trial.should_prune():
            self.pruned = True
            self.reason = f"Optuna's median pruner at evaluation {step} ({value:g})"
            return STOP
        return None

    def value(self) -> float | None:
        if not self.returns:
            return None
        return self.returns[-1] if self.objective == "final" else sum(self.returns) / len(
            self.returns)  # fmt: skip


def make_objective(plan: Plan) -> Callable[[Any], float]:
    """Optuna's objective: train one trial as a run in ``STUDY_DIR/trial-<n>`` and return its
    value. A pruned trial, a config the agent refuses (values its checks reject together) and a
    learner that diverged are *pruned*, with the reason in the trial's ``note``: they are
    outcomes of the values drawn, which TPE learns to avoid, not failures of the study."""

    def run_trial(trial) -> float:
        values = suggest(trial, plan.space, plan.total_steps)
        run_dir = Path(plan.study_dir) / f"trial-{trial.number}"
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("pid", os.getpid())
        agent_fields = {**values, **{k: v for k, v in plan.fixed.items()
                                     if k in _config_fields(plan.agent)}}  # fmt: skip
        try:
            config, _ = resolve_config(plan.agent, plan.env, None, agent_fields)
        except ConfigError as e:
            return _prune(trial, f"{plan.agent} refuses these values: {e}")
        resolved = to_json(config)
        trial.set_user_attr("config", {k: resolved[k] for k in agent_fields})
        trial.set_user_attr("settings", sorted(set(plan.fixed) - set(agent_fields)))
        report = ReportEvaluations(trial, plan.eval_every, plan.objective)
        try:
            run = train(plan.agent, plan.env, total_steps=plan.total_steps, seed=plan.seed,
                        run_dir=run_dir, eval_every=plan.eval_every,
                        eval_episodes=plan.eval_episodes, progress=False, callbacks=[report],
                        **{**plan.fixed, **values})  # fmt: skip
        except TrainingDiverged as e:
            return _prune(trial, f"diverged: {e}")
        if run.stopped:  # Ctrl-C or SIGTERM: Optuna marks the trial failed and stops
            trial.set_user_attr("note", "interrupted")
            raise KeyboardInterrupt
        if report.pruned:
            return _prune(trial, report.reason)
        value = report.value()
        if value is None or not math.isfinite(value):
            return _prune(trial, "no evaluation with a finite return")
        return value

    return run_trial


def _prune(trial, note: str):
    import optuna

    trial.set_user_attr("note", note[:300])
    raise optuna.TrialPruned(note)


def _config_fields(agent: str) -> set[str]:
    return set(BUILDERS[agent].config_class.__dataclass_fields__)


def _open_study(optuna, plan: Plan) -> None:
    """Create the study, or load it where the storage has it (a continued study): one made for
    another agent, environment, budget or objective is refused, for its values would not
    compare with the new trials'."""
    study = optuna.create_study(storage=_storage(optuna, plan.storage),
                                study_name=plan.study_name, direction="maximize",
                                load_if_exists=True)  # fmt: skip
    made_for = study.user_attrs.get("terms")
    if made_for is None:
        study.set_user_attr("terms", plan.terms)
    elif made_for != plan.terms:
        differ = ", ".join(f"{k} {made_for.get(k)!r}" for k in plan.terms
                           if made_for.get(k) != plan.terms[k])  # fmt: skip
        raise ConfigError(f"study {plan.study_name!r} in {plan.storage} was made with {differ}; "
                          "give the same flags to continue it, or another --study-name")
    _check_space(optuna, study, plan)


def _check_space(optuna, study, plan: Plan) -> None:
    """Refuse a continued study whose space draws a parameter from another kind of
    distribution (or, categorical, other choices) than its trials did: Optuna cannot mix them,
    and found out only as the first new trial drew it, with a traceback and a failed trial."""
    drawn: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        drawn.update(trial.distributions)
    recorder = _Distributions(optuna)
    suggest(recorder, plan.space, plan.total_steps)
    for name, new in recorder.drawn.items():
        if name not in drawn:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(drawn[name], new)
        except ValueError:
            raise ConfigError(
                f"study {plan.study_name!r} in {plan.storage} drew {name} from {drawn[name]}, "
                f"and this space draws it from {new}, which Optuna cannot mix: give the space "
                "the study was made with to continue it, or another --study-name"
            ) from None


class _Distributions:
    """Stands in for an Optuna trial in :func:`suggest`, keeping the distribution each
    parameter would be drawn from, by Optuna's name for it."""

    def __init__(self, optuna):
        self.optuna = optuna
        self.drawn: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: list) -> Any:
        self.drawn[name] = self.optuna.distributions.CategoricalDistribution(choices)
        return choices[0]

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        self.drawn[name] = self.optuna.distributions.FloatDistribution(low, high, log=log)
        return low

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        self.drawn[name] = self.optuna.distributions.IntDistribution(low, high, log=log)
        return low


def _storage(optuna, url: str):
    """The study's database. SQLite lets one writer in at a time: the workers wait for each
    other (up to a minute) instead of failing on a locked database. A URL that SQLAlchemy
    cannot open (no such dialect, driver or server) is one line naming it."""
    import sqlalchemy.exc

    wait = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=wait)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--storage {url}: Optuna cannot open it ({why}); give a database "
                          "URL such as sqlite:///study.db") from None


def _load_study(optuna, plan: Plan, **options: Any):
    return optuna.load_study(study_name=plan.study_name, storage=_storage(optuna, plan.storage),
                             **options)  # fmt: skip


def _work(plan: Plan, worker: int, trials: int) -> None:
    """One worker: ``trials`` trials of the study, printing a line as each ends. Each worker's
    sampler has its own seed (from ``--seed``, the worker and the trials already run), so that
    workers, and a continued study's new session, do not draw the same random values."""
    import numpy as np

    optuna = _import_optuna()  # in a worker process too: its logging level
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    before = len(_load_study(optuna, plan).trials)
    seed = int(np.random.SeedSequence([plan.seed, worker, before]).generate_state(1)[0])
    sampler = optuna.samplers.TPESampler(n_startup_trials=plan.startup_trials, seed=seed,
                                         multivariate=True)  # as RL Zoo's tuner
    pruner = optuna.pruners.MedianPruner(n_startup_trials=plan.startup_trials,
                                         n_warmup_steps=plan.warmup_evals)  # fmt: skip
    study = _load_study(optuna, plan, sampler=sampler, pruner=pruner)
    study.optimize(make_objective(plan), n_trials=trials, callbacks=[_print_trial])


def _print_trial(study, trial) -> None:
    seconds = (trial.duration.total_seconds() if trial.duration else 0.0)
    value = "" if trial.value is None else f" {trial.value:.4g}"
    note = trial.user_attrs.get("note", "")
    config = " ".join(f"{k}={_short(v)}" for k, v in trial.user_attrs.get("config", {}).items())
    print(f"trial {trial.number} {trial.state.name.lower()}{value} in {seconds:.0f} s: {config}"
          + (f" ({note})" if note else ""), file=sys.stderr, flush=True)  # fmt: skip


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value) if isinstance(value, str) else json.dumps(value).replace(" ", "")


def _run_workers(plan: Plan, shares: list[int]) -> None:
    """One spawned process per share of the trials. Ctrl-C (or SIGTERM to this process) is
    passed on as SIGTERM, which each worker's run takes as a request to stop at its next safe
    point; a worker still alive ``GRACE_S`` later is killed and its running trial marked
    failed. A worker that fails is reported once all have ended: its one-line error, or its
    traceback (printed by the worker)."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker_main, args=(plan, i, n), name=f"tune-worker-{i}")
               for i, n in enumerate(shares)]  # fmt: skip
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        _stop(workers, plan)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [(i, w.exitcode) for i, w in enumerate(workers) if w.exitcode != 0]
    if any(code == 130 for _, code in failed):
        raise KeyboardInterrupt  # a worker was interrupted on its own (a signal sent to it)
    if failed:
        what = "; ".join(f"worker {i} " + ("stopped on the error above" if code == 2 else
                                           f"crashed, {exit_status(code)} (see above)")
                         for i, code in failed)  # fmt: skip
        raise ConfigError(f"{what}; the study keeps the trials that finished")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(workers: list, plan: Plan) -> None:
    import optuna

    for worker in workers:
        if worker.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: kill them now
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
    killed = {w.pid for w in workers if w.is_alive()}
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join()
    if killed:
        study = _load_study(optuna, plan)
        for trial in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
            if trial.user_attrs.get("pid") in killed:
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def _worker_main(plan: Plan, worker: int, trials: int) -> None:
    """A worker process: its errors as the CLI reports them (one line for what a user can fix,
    a traceback for a bug), its exit code saying which (2, 1; 130 interrupted)."""
    signal.signal(signal.SIGTERM, _interrupt)  # between runs; a run handles it as Ctrl-C does
    warnings.formatwarning = one_line  # a spawned process starts with Python's
    try:
        _work(plan, worker, trials)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent's, after a Ctrl-C of ours
        sys.exit(130)
    except ConfigError as e:
        print(f"rlherd: error: worker {worker}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)


def write_outputs(optuna, plan: Plan) -> dict[str, Any]:
    """``trials.csv``, ``best.yaml`` and ``importance.png`` in the study's directory, and the
    summary that ``rlherd tune`` prints."""
    study_dir = Path(plan.study_dir)
    study = _load_study(optuna, plan)
    trials = study.get_trials(deepcopy=False)
    table = study_dir / "trials.csv"
    write_trials_csv(trials, table)
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in optuna.trial.TrialState}
    summary: dict[str, Any] = dict(study=plan.study_name, storage=plan.storage,
                                   study_dir=str(study_dir), trials=len(trials),
                                   states={k: v for k, v in counts.items() if v},
                                   trials_csv=str(table))  # fmt: skip
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        print("rlherd tune: no trial completed; no best.yaml", file=sys.stderr)
        return summary
    best = study.best_trial
    best_yaml = write_best_config(best, plan, study_dir / "best.yaml")
    importance = write_importance(optuna, study, study_dir / "importance.png")
    summary.update(best_trial=best.number, best_value=best.value,
                   best_config=best.user_attrs.get("config", {}), best_yaml=str(best_yaml),
                   importance=importance and str(importance))  # fmt: skip
    print(f"rlherd tune: best trial {best.number}, {plan.objective} {best.value:.4g}: "
          f"{best_yaml} (rlherd train --config {best_yaml}); table {table}",
          file=sys.stderr)  # fmt: skip
    return summary


def write_trials_csv(trials: list, path: Path) -> None:
    """One row per trial: its number, state, value, duration, why it was pruned, its run
    directory, and the config values it trained with (one column per field)."""
    fields = sorted({k for t in trials for k in t.user_attrs.get("config", {})})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["number", "state", "value", "duration_s", "note", "run_dir", *fields])
        for t in trials:
            config = t.user_attrs.get("config", {})
            writer.writerow([t.number, t.state.name, "" if t.value is None else t.value,
                             round(t.duration.total_seconds(), 1) if t.duration else "",
                             t.user_attrs.get("note", ""), t.user_attrs.get("run_dir", ""),
                             *(_cell(config.get(k)) for k in fields)])


def _cell(value: Any) -> Any:
    """A config value as a CSV cell: lists (tuple fields) as JSON, None as empty."""
    return json.dumps(value) if isinstance(value, list) else "" if value is None else value


def write_best_config(best, plan: Plan, path: Path) -> Path:
    """The best trial as a ``rlherd train --config`` file: its agent, env, runtime, preset, seed
    and steps, the config fields the study set (drawn or ``--set``) and the runtime settings
    ``--set`` gave, as the trial's run recorded them."""
    import yaml

    record = json.loads((Path(best.user_attrs["run_dir"]) / "config.json").read_text())
    config = best.user_attrs["config"]
    text = yaml.safe_dump(dict(
        agent=record["agent"], env=record["env"], runtime=record["runtime"],
        preset=record["preset"], seed=record["seed"], total_steps=record["total_steps"],
        config={k: record["config"][k] for k in config},
        settings={k: record["settings"][k] for k in best.user_attrs.get("settings", [])},
    ), sort_keys=False)  # fmt: skip
    header = (f"# rlherd tune: trial {best.number} of study {plan.study_name!r}, "
              f"{plan.objective} {best.value:.6g}; train it with rlherd train --config {path}\n")
    path.write_text(header + text)
    return path


def write_importance(optuna, study, path: Path) -> Path | None:
    """Optuna's parameter-importance plot (PED-ANOVA over the completed trials), or None with a
    note where it cannot be drawn (fewer than two completed trials, no parameter that varied)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.unlink(missing_ok=True)  # a continued study's old plot would pass for this one's
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        print("rlherd tune: importance.png needs two completed trials; not drawn",
              file=sys.stderr)  # fmt: skip
        return None
    with warnings.catch_warnings():  # experimental API; "few trials per regime" on small studies
        warnings.simplefilter("ignore")
        try:
            axes = optuna.visualization.matplotlib.plot_param_importances(study)
        except (ValueError, RuntimeError) as e:
            print(f"rlherd tune: importance.png not drawn: {e}", file=sys.stderr)
            return None
    axes.figure.savefig(path, bbox_inches="tight", dpi=100)
    plt.close(axes.figure)
    return path


__all__ = ["KINDS", "SPACES", "Plan", "ReportEvaluations", "load_space", "suggest", "tune"]
