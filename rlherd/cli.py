"""The ``rlherd`` command: ``train``, ``eval``, ``plot``, ``serve-env`` and ``check-env``."""

from __future__ import annotations

import argparse
import json
import sys

from rlherd.agents import BUILDERS
from rlherd.run.config import ConfigError, parse_set
from rlherd.runtime import RUNTIMES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlherd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train an agent; writes a run directory")
    train.add_argument("agent", nargs="?", choices=sorted(BUILDERS), help="agent to train")
    train.add_argument("--env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")
    train.add_argument("--runtime", choices=RUNTIMES, default="single")
    train.add_argument("--total-steps", type=int, help="agent steps to train for")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--preset", help="config preset (default: chosen from the env id)")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field"
    )
    train.add_argument("--run-dir", help="run directory (default: runs/<agent>-<env>-<time>)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    train.add_argument(
        "--eval-every", type=int, default=0, metavar="N", help="evaluate every N agent steps"
    )
    train.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--env-kwargs", default=None, metavar="JSON", help="environment options (a JSON object)"
    )
    train.add_argument("--num-envs", type=int, metavar="N", help="environments (num_envs)")
    train.add_argument("--device", help="where learning runs: cpu, cuda, cuda:1 (device)")
    train.add_argument(
        "--num-servers", type=int, metavar="N", help="poly: local environment servers to start"
    )
    train.add_argument(
        "--env-servers", metavar="ADDR,...", help="poly: use these running environment servers"
    )

    ev = sub.add_parser("eval", help="run a trained policy")
    ev.add_argument("run_dir")
    ev.add_argument("--episodes", type=int, default=10)
    ev.add_argument("--video", help="record the first episode to FILE (.gif or .mp4)")
    ev.add_argument("--sample", action="store_true", help="sample actions instead of greedy")

    add_serve_arguments(sub.add_parser("serve-env", help="serve an environment over gRPC"))

    check = sub.add_parser("check-env", help="check a device environment against its reference")
    check.add_argument("env", help="tag-gridworld, tag-continuous or CartPole-v1")
    check.add_argument("--num-envs", type=int, default=16)
    check.add_argument("--steps", type=int, default=500, help="steps of every environment")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--device", default="cpu")
    check.add_argument("--env-kwargs", default=None, metavar="JSON", help="environment options")

    plot = sub.add_parser("plot", help="draw learning curves of runs")
    plot.add_argument("run_dirs", nargs="+")
    plot.add_argument("-o", "--output", required=True, help="image file, e.g. curves.png")
    plot.add_argument("--window", type=int, default=20, help="episodes to average over")
    return parser


def _flag_overrides(args: argparse.Namespace) -> dict:
    """Config fields that have flags of their own."""
    flags = dict(num_servers=args.num_servers, env_servers=args.env_servers,
                 num_envs=args.num_envs, device=args.device)  # fmt: skip
    return {k: v for k, v in flags.items() if v is not None}


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


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """``rlherd serve-env``'s arguments (also ``python -m rlherd.envs.server``)."""
    parser.add_argument("env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")
    parser.add_argument(
        "--address",
        default="127.0.0.1:50051",
        help="host:port or unix:PATH (default 127.0.0.1:50051: loopback only)",
    )
    parser.add_argument("--envs-per-stream", type=int, default=1, metavar="K")
    parser.add_argument("--max-streams", type=int, default=64)
    parser.add_argument(
        "--env-kwargs", default="{}", metavar="JSON", help="keyword arguments of rlherd.make"
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            from rlherd.run.train import train

            if args.resume is None and (args.agent is None or args.env is None):
                parser.error("train needs an agent and --env (or --resume RUN_DIR)")
            run = train(
                args.agent,
                args.env,
                runtime=args.runtime,
                total_steps=args.total_steps,
                seed=args.seed,
                run_dir=args.run_dir,
                resume=args.resume,
                preset=args.preset,
                eval_every=args.eval_every,
                eval_episodes=args.eval_episodes,
                progress=not args.no_progress,
                env_kwargs=_env_kwargs(args.env_kwargs),
                **parse_set(args.set),
                **_flag_overrides(args),
            )
            print(json.dumps(run.summary))
            print(f"run directory: {run.path}", file=sys.stderr)
        elif args.command == "eval":
            from rlherd.run.evaluate import evaluate

            print(json.dumps(evaluate(args.run_dir, args.episodes, args.video, not args.sample)))
        elif args.command == "check-env":
            from rlherd.envs.device import ConsistencyError, check_consistency, make_device

            env = make_device(args.env, args.num_envs, args.device, args.seed,
                              **(_env_kwargs(args.env_kwargs) or {}))  # fmt: skip
            try:
                result = check_consistency(env, steps=args.steps, seed=args.seed)
            except ConsistencyError as e:
                print(f"rlherd: {args.env} is NOT consistent with its reference: {e}",
                      file=sys.stderr)  # fmt: skip
                return 1
            print(json.dumps(dict(env=args.env, consistent=True, **result)))
        elif args.command == "serve-env":
            from rlherd.envs.server import run

            return run(args)
        elif args.command == "plot":
            from rlherd.run.plot import plot_runs

            print(plot_runs(args.run_dirs, args.output, args.window))
    except (ConfigError, FileNotFoundError, ValueError, TypeError, ImportError) as e:
        print(f"rlherd: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
