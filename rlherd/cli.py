"""The rlherd command: train reinforcement learning agents in one process, in many, on a Ray
cluster or on a GPU, and evaluate, compare and share the runs. 'rlherd COMMAND -h' says more of
each command."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

# Building the parsers reads only torch-free tables (agent and runtime names, the runtime
# settings' dataclasses); each command imports what it runs when it runs, so ``--help`` answers
# without loading torch, Ray or an environment family.
from rlherd.agents import AGENTS
from rlherd.config import check_seed, parse_set
from rlherd.errors import ConfigError, NodeDied, Stalled, TrainingDiverged, one_line
from rlherd.runtime import RUNTIMES, settings


def _parser() -> argparse.ArgumentParser:
    # Flags are never abbreviated: argparse would read `train --agent ppo` as --agent-index.
    strict = functools.partial(argparse.ArgumentParser, allow_abbrev=False)
    parser = strict(prog="rlherd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=strict)
    for add in PARSERS:
        add(sub)
    return parser


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd train``: its arguments, callbacks and the runtimes' settings."""
    train = sub.add_parser("train", help="train an agent; writes a run directory")
    train.add_argument("agent", nargs="?", choices=sorted(AGENTS), help="agent to train")
    train.add_argument("--env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")
    train.add_argument("--runtime", choices=RUNTIMES,
                       help="where it runs (default: single, or the one runtime that runs the "
                       "agent with the settings given, e.g. offline for --dataset)")  # fmt: skip
    train.add_argument(
        "--total-steps", type=int,
        help="steps to train for: environment steps (offline: learner steps)"
    )
    train.add_argument("--seed", type=int, help="random seed (default: 0)")
    train.add_argument("--seeds", metavar="SEEDS",
                       help="train once per seed (1-5, 1,2,3), in parallel processes, each run "
                       "in --run-dir/seed-K")  # fmt: skip
    train.add_argument("--jobs", type=int, metavar="N",
                       help="[--seeds] seeds at once (default: as many as fit the cores)")
    train.add_argument("--preset", help="config preset (default: chosen from the env id)")
    train.add_argument("--config", metavar="FILE",
                       help="a YAML or JSON file of train's arguments: agent, env, config (agent "
                       "fields), settings, ... (a run's config.json is one); flags win over it")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="set an agent config field"
    )
    train.add_argument("--run-dir", help="run directory (default: runs/<agent>-<env>-<time>)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    train.add_argument(
        "--overwrite", action="store_true", help="replace the run already in --run-dir"
    )
    train.add_argument(
        "--eval-every", type=int, metavar="N",
        help="evaluate every N steps and at the end (offline: learner steps; default a tenth "
        "of the run)",
    )
    train.add_argument(
        "--eval-episodes", type=int,
        help="episodes per evaluation (default: 10; given alone: one evaluation, at the end)"
    )
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--env-kwargs", default=None, metavar="JSON", help="environment options (a JSON object)"
    )
    watch = train.add_argument_group("callbacks and tracking (given anew with --resume)")
    watch.add_argument("--stop-at-return", type=float, metavar="R",
                       help="stop once an evaluation's mean return reaches R (set --eval-every)")
    watch.add_argument("--patience", type=int, metavar="N",
                       help="stop after N evaluations without a better mean return")
    watch.add_argument("--until-solved", action="store_true",
                       help="bsuite deep sea ids: stop once bsuite's analysis counts the run "
                       "solved (its score is then what the whole budget would give)")
    watch.add_argument("--save-best", action="store_true",
                       help="keep the best evaluation's policy in RUN/best/ (rlherd eval --best)")
    watch.add_argument("--track", default="", metavar="NAMES",
                       help="log to experiment trackers: wandb, mlflow, or wandb,mlflow")
    watch.add_argument("--track-project", default="rlherd",
                       help="the W&B project or MLflow experiment (default: rlherd)")
    watch.add_argument("--track-uri", help="MLflow's tracking URI (default: MLflow's own)")
    _add_setting_flags(train.add_argument_group("runtime settings (each used by some runtimes)"))


def _add_eval_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd eval``: play a run's policy, or record its episodes."""
    ev = sub.add_parser("eval", help="run a trained policy")
    ev.add_argument("run_dir")
    ev.add_argument("--episodes", type=int, help="episodes to play (default: 10)")
    ev.add_argument("--video", help="record the first episode to FILE (.gif or .mp4)")
    ev.add_argument("--sample", action="store_true", help="sample actions instead of greedy")
    ev.add_argument("--best", action="store_true",
                    help="the best evaluation's policy (kept by train --save-best), not the "
                    "latest")  # fmt: skip
    ev.add_argument("--opponent", help="two-player games, the other side of --episodes games "
                    "(win/draw/loss rates by seat): random or mcts:N; OpenSpiel games: perfect; "
                    "turn-based PettingZoo games: latest, snapshot:K or snapshots (each of the "
                    "run's snapshots; Elo ratings in ratings.csv)")  # fmt: skip
    ev.add_argument("--record-episodes", type=int, metavar="N",
                    help="record N greedy episodes as demonstrations (a Minari dataset, --out) "
                    "instead of evaluating; train with --demonstrations ID")  # fmt: skip
    ev.add_argument("--out", metavar="ID", help="the dataset id --record-episodes writes")


def _add_collect_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd collect``: a policy's episodes as a Minari dataset."""
    col = sub.add_parser("collect", help="record a policy's episodes as an offline dataset")
    col.add_argument("run_dir", nargs="?", help="the run whose policy acts (none: a random one)")
    col.add_argument("--out", required=True, metavar="ID", help="Minari dataset id to write")
    col.add_argument("--episodes", type=int, default=100)
    col.add_argument("--env", help="environment id (for a random policy)")
    col.add_argument("--env-kwargs", default=None, metavar="JSON", help="environment options")
    col.add_argument("--epsilon", type=float, default=0.0,
                     help="probability of a uniformly random action at each step")  # fmt: skip
    col.add_argument("--seed", type=int, default=0)
    col.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _add_serve_env_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd serve-env``, whose own parser lives with the server (it needs gRPC)."""
    sub.add_parser(
        "serve-env", add_help=False, help="serve an environment over gRPC (see serve-env -h)"
    )


def _add_check_env_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd check-env``: what rlherd makes of an environment."""
    check = sub.add_parser(
        "check-env",
        help="check an environment: Gymnasium's checker, its observation and how agents read "
        "it, its action mask, its speed, and which agents and runtimes train it",
    )
    check.add_argument("env", help="any environment id, module:Env-v0 or module:factory")
    check.add_argument("--env-kwargs", default=None, metavar="JSON", help="environment options")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--seconds", type=float, default=2.0, help="how long to time raw steps")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--strict", action="store_true",
                       help="exit 1 when Gymnasium's checker fails, too (otherwise: only when no "
                       "agent trains the environment)")  # fmt: skip
    check.add_argument("--consistency", action="store_true",
                       help="instead: check a device environment (tag-gridworld, tag-continuous, "
                       "CartPole-v1) against its numpy reference")  # fmt: skip
    check.add_argument("--num-envs", type=int, help="[--consistency] (default: 16)")
    check.add_argument("--steps", type=int,
                       help="[--consistency] steps of every environment (default: 500)")
    check.add_argument("--device", help="[--consistency] (default: cpu)")


def _add_plot_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd plot``: learning curves."""
    plot = sub.add_parser("plot", help="draw learning curves of runs")
    plot.add_argument("run_dirs", nargs="+")
    plot.add_argument("-o", "--output", required=True,
                      help="image file, e.g. curves.png, or a folder to draw curves.png in "
                      "(one that exists, or figures/)")  # fmt: skip
    plot.add_argument("--window", type=int, default=20, help="episodes to average over")
    plot.add_argument("--title", help="the figure's title")
    plot.add_argument("--aggregate", choices=["mean", "iqm"],
                      help="one curve per experiment: its seeds' mean or IQM, with a 95%% "
                      "bootstrap band")  # fmt: skip
    plot.add_argument("--reps", type=int, default=500,
                      help="[--aggregate] bootstrap resamples (500) at each of the curve's 40 "
                      "points")  # fmt: skip


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd report``: final returns over seeds."""
    report = sub.add_parser("report", help="final returns over seeds: IQM, mean and 95%% CIs")
    report.add_argument("run_dirs", nargs="+", metavar="RUNS",
                        help="run directories, or folders holding them (a --seeds parent)")
    report.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (2000)")
    report.add_argument("--json", action="store_true", help="print JSON lines, one per row")


def _add_package_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd package``: a run's policy as a folder to share."""
    pack = sub.add_parser("package", help="a run's policy as a folder to share: weights, config, "
                          "model card, curves and a video (a Hugging Face Hub model "
                          "repository)")  # fmt: skip
    pack.add_argument("run_dir")
    pack.add_argument("-o", "--output", required=True, metavar="DIR", help="the package's folder")
    pack.add_argument("--episodes", type=int, default=10, help="episodes the card's score plays")
    pack.add_argument("--no-video", action="store_true", help="leave out the episode's video")
    pack.add_argument("--overwrite", action="store_true",
                      help="replace the package files already in DIR")  # fmt: skip
    pack.add_argument("--best", action="store_true",
                      help="the best evaluation's policy (train --save-best), not the latest")


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd export``: a policy as ONNX or TorchScript."""
    export = sub.add_parser("export", help="write a run's policy, with its preprocessing, as "
                            "an ONNX or TorchScript file to act with outside rlherd")  # fmt: skip
    export.add_argument("run_dir")
    export.add_argument("--format", choices=("onnx", "torchscript"),
                        help="default: as -o's suffix says (.onnx, .pt or .pth), else onnx")
    export.add_argument("--stochastic", action="store_true",
                        help="sample actions (from a noise input) instead of the greedy one")
    export.add_argument("-o", "--output", metavar="PATH",
                        help="where to write: a file, or a folder to write it in (default: "
                        "policy.onnx or policy.pt in the run)")
    export.add_argument("--best", action="store_true",
                        help="the best evaluation's policy (train --save-best), not the latest")


def _add_tune_parser(sub: argparse._SubParsersAction) -> None:
    """``rlherd tune`` (rlherd.commands.tune): a hyperparameter sweep with Optuna."""
    tune = sub.add_parser("tune", help="search an agent's hyperparameters with Optuna (TPE, "
                          "median pruning); writes best.yaml, trials.csv, importance.png")
    tune.add_argument("agent", choices=sorted(AGENTS), help="agent to tune")
    tune.add_argument("--env", required=True, help="environment id, e.g. CartPole-v1")
    tune.add_argument("--trials", type=int, required=True, metavar="N",
                      help="trials to run now (a continued study adds N more)")
    tune.add_argument("--jobs", type=int, default=1, metavar="J",
                      help="worker processes sharing the study (default: 1)")
    tune.add_argument("--storage", metavar="URL",
                      help="Optuna storage (default: sqlite:///STUDY_DIR/study.db)")
    tune.add_argument("--study-name", help="the study's name in the storage (default: AGENT-ENV)")
    tune.add_argument("--space", metavar="FILE",
                      help="YAML of field: [KIND, LOW, HIGH] or [categorical, [CHOICES]] that "
                      "replaces or adds to the agent's space (null drops a field)")
    tune.add_argument("--total-steps", type=int, metavar="N",
                      help="steps per trial (default: the preset's run length)")
    tune.add_argument("--eval-every", type=int, metavar="N",
                      help="evaluate every N steps (default: a tenth of the trial)")
    tune.add_argument("--eval-episodes", type=int, default=5, metavar="N",
                      help="episodes per evaluation (default: 5)")
    tune.add_argument("--objective", choices=("auc", "final"), default="auc",
                      help="a trial's value: auc, the mean of its evaluations (sooner scores "
                      "more), or final, its last evaluation (default: auc)")
    tune.add_argument("--seed", type=int, default=0,
                      help="every trial's training seed; the samplers' derive from it (default: 0)")
    tune.add_argument("--startup-trials", type=int, default=5, metavar="N",
                      help="trials drawn at random before TPE models the space, and completed "
                      "before the pruner compares (default: 5)")
    tune.add_argument("--warmup-evals", type=int, metavar="K",
                      help="evaluations before a trial may be pruned (default: a third of them)")
    tune.add_argument("--out", metavar="DIR",
                      help="the study's directory (default: runs/tune-AGENT-ENV-TIME)")
    tune.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="fix an agent config field or runtime setting in every trial (it "
                      "leaves the search space)")


def _add_bsuite_parsers(sub: argparse._SubParsersAction) -> None:
    """``rlherd bsuite`` (sweeps) and ``rlherd bsuite-report`` (bsuite's scoring)."""
    sweep = sub.add_parser("bsuite", help="sweep an agent over bsuite ids (parallel, resumable); "
                           "writes a run per id and bsuite's CSVs")
    sweep.add_argument("agent", choices=sorted(AGENTS), help="agent to sweep")
    sweep.add_argument("--experiments", nargs="+", metavar="NAME",
                       help="bsuite experiments (deep_sea, memory_len, ...; default: all)")
    sweep.add_argument("--ids", nargs="+", metavar="ID",
                       help="ids among them (deep_sea/0 ...; a number N: each experiment's "
                       "N), or 'subset': 5 per experiment, "
                       "spread from its easiest setting to its hardest (default: all)")
    sweep.add_argument("--jobs", type=int, metavar="N",
                       help="runs at once (default: as many as the cores hold)")
    sweep.add_argument("--out", required=True, metavar="DIR",
                       help="the sweep's folder: one run per id, csv/ for bsuite's loader; "
                       "sweeping into it again keeps finished ids and continues the rest")
    sweep.add_argument("--kept", metavar="DIR",
                       help="a folder of finished ids (each one's bsuite CSV, config and "
                       "summary; no checkpoints) to start from, and to add this sweep's "
                       "finished ids to: sweeps on other machines or fresh clones add up there")
    sweep.add_argument("--total-episodes", type=int, metavar="N",
                       help="episodes per id instead of bsuite's budget (a smoke test: bsuite's "
                       "scores need its budget)")
    sweep.add_argument("--seed", type=int, default=0,
                       help="bsuite/EXPERIMENT/N runs with seed 1000 * SEED + N (default: 0)")
    sweep.add_argument("--until-solved", action="store_true",
                       help="stop each deep sea id once bsuite's analysis counts it solved (its "
                       "score is then what the whole budget would give; unsolved ids play it all)")
    sweep.add_argument("--preset", help="the agent's preset (default: the one it picks)")
    sweep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="an agent config field or runtime setting (torch_threads=2) for "
                       "every id")
    sweep.add_argument("--no-progress", action="store_true")

    bsreport = sub.add_parser("bsuite-report", help="score bsuite sweeps with bsuite's own "
                              "analysis: per-experiment scores, radar and bar plots, a table")
    bsreport.add_argument("dirs", nargs="+", metavar="DIR", help="sweeps (rlherd bsuite --out)")
    bsreport.add_argument("-o", "--output", default="bsuite-report", metavar="DIR",
                          help="where the plots and tables go (default: bsuite-report)")


# The commands, in the order --help lists them.
PARSERS = (_add_train_parser, _add_eval_parser, _add_collect_parser, _add_serve_env_parser,
           _add_check_env_parser, _add_plot_parser, _add_report_parser, _add_package_parser,
           _add_export_parser, _add_tune_parser, _add_bsuite_parsers)


_METAVARS = {"int": "N", "int | None": "N", "float": "X", "str": "TEXT", "dict": "JSON"}


def _add_setting_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per runtime setting (``num_actors`` -> ``--num-actors N``); booleans may be given
    bare (``--compile``). Values are parsed by the settings' own types."""
    helps, classes = settings.field_help(), settings.classes()
    users = {name: [r for r, cls in classes.items() if name in settings.names(cls)]
             for name in settings.all_fields()}  # fmt: skip
    for name, field in settings.all_fields().items():
        where = "all" if len(users[name]) == len(classes) else ", ".join(users[name])
        text = helps.get(name, "").replace("%", "%%")  # argparse formats help with %
        flag = dict(dest=name, default=None, help=f"{text} [{where}]")
        if field.type in ("bool", bool):
            flag.update(nargs="?", const="true", metavar="BOOL")
        else:
            # A type is a string under ``from __future__ import annotations``, else a class.
            kind = field.type if isinstance(field.type, str) else getattr(
                field.type, "__name__", str(field.type))
            flag.update(metavar=_METAVARS.get(kind, "VALUE"))
        group.add_argument(f"--{name.replace('_', '-')}", **flag)


def _setting_flags(args: argparse.Namespace) -> dict[str, str]:
    """The runtime settings given as flags."""
    return {k: getattr(args, k) for k in settings.all_fields() if getattr(args, k) is not None}


def _agent_sets(items: list[str], own: set[str]) -> dict[str, str]:
    """``--set`` is for agent fields; runtime settings and train's ``own`` arguments (seed,
    total_steps, ...) have flags of their own, which parse their values (``--set seed=5``
    reached train as the text ``'5'``)."""
    sets = parse_set(items)
    misplaced = sorted(set(sets) & (set(settings.all_fields()) | own))
    if misplaced:
        flags = ", ".join(f"--{k.replace('_', '-')} {sets[k]}" for k in misplaced)
        raise ConfigError(f"{', '.join(misplaced)}: runtime settings and train's own options "
                          f"are flags; use {flags}")  # fmt: skip
    return sets


def _train_arguments(args: argparse.Namespace) -> dict:
    """What ``train`` is told to train: the ``--config`` file's values, under the flags given
    (a flag wins over the file; ``--set`` over its ``config``, setting flags over its
    ``settings``)."""
    from rlherd.config import read_config_file

    if args.config and args.resume:
        raise ConfigError("--resume continues a run with its own config; drop --config")
    file = read_config_file(args.config) if args.config else {}
    if file and _recorded(Path(args.config)):
        file = _portable(file, Path(args.config).parent)
    flags = dict(agent=args.agent, env=args.env, runtime=args.runtime, seed=args.seed,
                 total_steps=args.total_steps, preset=args.preset, eval_every=args.eval_every,
                 eval_episodes=args.eval_episodes,
                 env_kwargs=_env_kwargs(args.env_kwargs))  # fmt: skip
    given = {k: file.get(k) if v is None else v for k, v in flags.items()}
    # A run's config.json records every setting of its runtime, those only the other dataflow
    # uses at their defaults: as given, they would be refused.
    fields = settings.all_fields()
    file_settings = {k: v for k, v in file.get("settings", {}).items()
                     if not (k in settings.DATAFLOW_ONLY and v == fields[k].default)}  # fmt: skip
    own = set(flags) - {"agent"}  # the agent is named, not flagged
    return {**given, **file.get("config", {}), **_agent_sets(args.set, own), **file_settings,
            **_setting_flags(args)}


def _dataset_needs_env(dataset_id: str) -> str:
    """An offline run still evaluates its policy in the environment: the line naming it."""
    from rlherd.replay.offline import recorded_env

    env = recorded_env(dataset_id)
    where = f": --env {env}, where it was recorded" if env else ""
    return f"--dataset {dataset_id} needs --env, the environment its policy is evaluated in{where}"


def _recorded(path: Path) -> bool:
    """Whether ``path`` is a run's (or a package's) own config.json: a record of another
    machine, maybe someone else's."""
    folder = path.parent
    return path.name == "config.json" and any(
        (folder / name).exists() for name in ("summary.json", "checkpoints", "policy.safetensors"))


def _portable(file: dict, folder: Path) -> dict:
    """A run's record as a config file here: its environment's module must be an installed one
    (a shared run's folder may hold code of its own, never to be imported), and the settings
    that name the machine it ran on (its device, servers, cluster) are left out."""
    from rlherd.envs.ids import check_recorded

    if "env" in file:
        check_recorded(file["env"], folder)
    kept = {k: v for k, v in file.get("settings", {}).items()
            if k not in settings.MACHINE_SETTINGS}  # fmt: skip
    return {**file, "settings": kept}


def _callbacks(args: argparse.Namespace) -> list:
    """The ready-made callbacks that ``train``'s flags ask for."""
    from rlherd.run.callbacks import SaveBest, StopAtReturn, StopWithoutImprovement

    made: list = []
    if args.stop_at_return is not None:
        made.append(StopAtReturn(args.stop_at_return))
    if args.patience is not None:
        made.append(StopWithoutImprovement(args.patience))
    if args.save_best:
        made.append(SaveBest())
    if args.until_solved:
        from rlherd.commands.bsuite import UntilSolved

        made.append(UntilSolved())
    return made


def _env_kwargs(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--env-kwargs must be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, got {text!r}")
    return value


def _train(args: argparse.Namespace, words: list[str], parser: argparse.ArgumentParser) -> int:
    """``rlherd train``: one run, or a group of seeds (``words``: the command line, which each
    seed's process is given)."""
    from rlherd.commands import bsuite, seeds
    from rlherd.commands.train import train

    if seeds.GROUP_VARIABLE in os.environ:  # one seed of a `train --seeds` group
        seeds.stop_with_group()
    given = _train_arguments(args)
    if args.resume is None and given["env"] is None and given.get("dataset"):
        raise ConfigError(_dataset_needs_env(given["dataset"]))
    if args.resume is None and (given["agent"] is None or given["env"] is None):
        parser.error("train needs an agent and --env (or --config FILE, or --resume RUN_DIR)")
    if args.resume is not None:
        bsuite.check_not_sweep(args.resume)
    if args.seeds is not None or seeds.is_seed_parent(args.resume):
        return seeds.command(args, words[words.index("train") + 1:], given)
    run = train(
        run_dir=args.run_dir,
        resume=args.resume,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        callbacks=_callbacks(args),
        track=args.track,
        track_project=args.track_project,
        track_uri=args.track_uri,
        **given,
    )
    print(json.dumps(run.summary))
    if run.finished_before:
        print(f"rlherd: {run.path} finished at {run.steps} steps; nothing to do (train it "
              f"longer with --resume {run.path} --total-steps N)", file=sys.stderr)  # fmt: skip
    elif "stopped_by" in run.summary and not run.stopped:
        print(f"rlherd: stopped by {run.summary['stopped_by']} at step {run.steps}; run "
              f"directory: {run.path}", file=sys.stderr)  # fmt: skip
    elif run.stopped:
        print(f"rlherd: interrupted at step {run.steps}; resume with `rlherd train --resume "
              f"{run.path}`", file=sys.stderr)  # fmt: skip
        return 128 + run.signal  # 130 for Ctrl-C, 143 for SIGTERM, as shells expect
    else:
        print(f"run directory: {run.path}", file=sys.stderr)
    return 0


def _eval(args: argparse.Namespace) -> int:
    if args.record_episodes or args.out:  # eval that records: collect's older spelling
        if not (args.record_episodes and args.out):
            raise ConfigError("--record-episodes N and --out ID go together")
        # Recording plays the latest policy greedily; these would have been ignored.
        given = {"--episodes": args.episodes is not None, "--video": args.video,
                 "--sample": args.sample, "--best": args.best, "--opponent": args.opponent}
        if ignored := [flag for flag, value in given.items() if value]:
            raise ConfigError(f"--record-episodes records the latest policy's greedy episodes; "
                              f"drop {', '.join(ignored)}, which go with evaluating it")
        from rlherd.commands.collect import collect

        print(json.dumps(collect(args.run_dir, args.out, args.record_episodes)))
        return 0
    from rlherd.commands.evaluate import evaluate

    episodes = 10 if args.episodes is None else args.episodes
    print(json.dumps(evaluate(args.run_dir, episodes, args.video, not args.sample,
                              opponent=args.opponent, best=args.best)))  # fmt: skip
    return 0


def _collect(args: argparse.Namespace) -> int:
    from rlherd.commands.collect import collect

    print(json.dumps(collect(args.run_dir, args.out, args.episodes, env=args.env,
                             env_kwargs=_env_kwargs(args.env_kwargs), epsilon=args.epsilon,
                             seed=args.seed, progress=not args.no_progress)))  # fmt: skip
    return 0


def _check_env(args: argparse.Namespace) -> int:
    """Exit 1 where no agent trains the environment (or, with --strict, Gymnasium's checker
    fails), or a device environment differs from its reference."""
    if args.consistency:
        return _consistency(args)
    if any(flag is not None for flag in (args.num_envs, args.steps, args.device)):
        raise ConfigError("--num-envs, --steps and --device go with --consistency (a device "
                          "environment's check); drop them")  # fmt: skip
    from rlherd.commands.check_env import check, format_report, trainable

    report = check(args.env, _env_kwargs(args.env_kwargs), args.seconds, args.seed)
    print(json.dumps(report) if args.json else format_report(report))
    return 0 if trainable(report) and (report["gymnasium_check"] or not args.strict) else 1


def _consistency(args: argparse.Namespace) -> int:
    """``check-env --consistency``: a device environment against its numpy reference."""
    from rlherd.envs.device import ConsistencyError, check_consistency, make_device

    num_envs = 16 if args.num_envs is None else args.num_envs
    steps = 500 if args.steps is None else args.steps
    device = args.device or "cpu"
    settings.check_device(device, "--device")
    if num_envs < 1 or steps < 1:  # no environment, or no step, checks nothing
        raise ConfigError(f"--num-envs and --steps must be >= 1, got {num_envs} and {steps}")
    env = make_device(args.env, num_envs, device, args.seed,
                      **(_env_kwargs(args.env_kwargs) or {}))  # fmt: skip
    try:
        result = check_consistency(env, steps=steps, seed=args.seed)
    except ConsistencyError as e:
        print(f"rlherd: {args.env} is NOT consistent with its reference: {e}", file=sys.stderr)
        return 1
    print(json.dumps(dict(env=args.env, consistent=True, **result)))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from rlherd.commands.plot import plot_runs

    print(plot_runs(args.run_dirs, args.output, args.window, args.title,
                    aggregate=args.aggregate, reps=args.reps))  # fmt: skip
    return 0


def _report(args: argparse.Namespace) -> int:
    from rlherd.commands.report import print_table, report

    rows = report(args.run_dirs, args.reps)
    if args.json:
        print("\n".join(json.dumps(row) for row in rows))
    else:
        print_table(rows, args.reps)
    return 0


def _package(args: argparse.Namespace) -> int:
    from rlherd.commands.package import package

    print(json.dumps(package(args.run_dir, args.output, args.episodes, not args.no_video,
                             args.overwrite, best=args.best)))  # fmt: skip
    return 0


def _export(args: argparse.Namespace) -> int:
    from rlherd.commands.export import export

    print(export(args.run_dir, args.format, args.stochastic, args.output, args.best))
    return 0


def _bsuite(args: argparse.Namespace) -> int:
    from rlherd.commands.bsuite import command

    return command(args, parse_set(args.set))


def _bsuite_report(args: argparse.Namespace) -> int:
    from rlherd.commands.bsuite import report_command

    return report_command(args)


def _tune(args: argparse.Namespace) -> int:
    from rlherd.commands.tune import tune

    summary = tune(args.agent, args.env, trials=args.trials, jobs=args.jobs,
                   storage=args.storage, study_name=args.study_name, space=args.space,
                   total_steps=args.total_steps, eval_every=args.eval_every,
                   eval_episodes=args.eval_episodes, objective=args.objective, seed=args.seed,
                   startup_trials=args.startup_trials, warmup_evals=args.warmup_evals,
                   out=args.out, fixed=parse_set(args.set))  # fmt: skip
    print(json.dumps(summary))
    return 130 if summary["interrupted"] else 0


# Each command's handler, chosen here alone: it returns the exit status. (train and serve-env,
# which read the command line itself, are dispatched in main.)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "eval": _eval,
    "collect": _collect,
    "check-env": _check_env,
    "plot": _plot,
    "report": _report,
    "package": _package,
    "export": _export,
    "tune": _tune,
    "bsuite": _bsuite,
    "bsuite-report": _bsuite_report,
}


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the rlherd command itself; a caller's own process keeps its format
        warnings.formatwarning = one_line
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "serve-env":
        agent = "; the agent is train's first argument: rlherd train AGENT --env ENV"
        parser.error(f"unrecognized arguments: {' '.join(rest)}"
                     + (agent if args.command == "train" and "--agent" in rest else ""))
    try:
        if getattr(args, "seed", None) is not None:
            check_seed(args.seed, "--seed")
        if args.command == "serve-env":  # its own parser, in the module that needs gRPC
            from rlherd.envs.server import main as serve_env

            return serve_env(rest)
        if args.command == "train":
            return _train(args, argv if argv is not None else sys.argv[1:], parser)
        return COMMANDS[args.command](args)
    except (ConfigError, TrainingDiverged, FileNotFoundError) as e:
        # What a user can fix (an id, an option, an extra, a path, a learning rate): one line.
        # Anything else is a bug, and keeps its traceback.
        print(f"rlherd: error: {e}", file=sys.stderr)
        return 2
    except (NodeDied, Stalled) as e:  # a fault the run reported, with how to continue
        print(f"rlherd: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before a run takes its signals (importing torch), or twice
        print("rlherd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
