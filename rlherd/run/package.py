"""A package: a trained policy in a folder to share, laid out as a Hugging Face Hub model
repository accepts it (``rlherd package RUN -o DIR`` writes one, :mod:`rlherd.commands.package`).
Its files:

    README.md            the model card; its YAML front matter is what the Hub reads
    config.json          the run's record (a RunRecord, as in a run directory) and, under
                         "package", the counters of the checkpoint the policy came from
    policy.safetensors   the policy's state dict: parameters and buffers (PPO's observation
                         statistics among them), nothing of the optimiser or replay
    summary.json         the run's summary with the package's evaluation
    curves.png           the run's learning curves
    replay.mp4 or .gif   a greedy episode

Everything that loads runs reads a package too: :func:`rlherd.commands.evaluate.load_run` hands
it to :func:`read_package`, which returns the record and the parts of a checkpoint that acting
reads, so ``rlherd eval``, ``rlherd.load_policy`` and ``rlherd collect`` take either. Like a run
directory, a package is read as plain data only (JSON and safetensors): nothing in it can run
code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlherd.core import POLICY_KEY
from rlherd.errors import ConfigError, MissingExtra
from rlherd.run.rundir import PACKAGE_KEY, RunRecord, atomic_write_bytes, read_json, read_record

CONFIG_FILE = "config.json"
POLICY_FILE = "policy.safetensors"
SUMMARY_FILE = "summary.json"


def is_package(path: str | Path) -> bool:
    """Whether ``path`` is a package rather than a run directory: it holds a policy file, or a
    config.json that says it is a package's (one that lost its policy file is still one, so that
    reading it says what is missing). A run's config.json without checkpoints (a copy of its
    results, as a bsuite sweep's ``--kept`` keeps) is a run's, whose reading says so."""
    path = Path(path)
    return (path / POLICY_FILE).is_file() or (
        (path / CONFIG_FILE).is_file() and PACKAGE_KEY in read_json(path / CONFIG_FILE)
    )


def _safetensors():
    try:
        import safetensors.torch
    except ImportError as e:
        raise MissingExtra("packages hold their policy in safetensors: pip install "
                           "'rlherd[export]'") from e  # fmt: skip
    return safetensors


def write_policy(path: Path, policy: dict[str, torch.Tensor]) -> None:
    """Write the policy's state dict to ``path`` (safetensors, atomically). Each tensor is
    copied: safetensors refuses tensors that share memory, as tied weights do."""
    safetensors = _safetensors()
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in policy.items()}
    atomic_write_bytes(path, safetensors.torch.save(tensors, metadata={"format": "pt"}))


def read_package(path: str | Path) -> tuple[RunRecord, dict[str, Any]]:
    """The package's record, and a checkpoint of the parts that acting reads: the policy
    (``checkpoint["learner"][POLICY_KEY]``) and the step counters it was saved at
    (``checkpoint["recorder"]["counters"]``). A missing or damaged file is one line."""
    path = Path(path)
    for name in (CONFIG_FILE, POLICY_FILE):
        if not (path / name).is_file():
            raise ConfigError(f"{path / name} is missing, so {path} is not a whole package; "
                              f"package the run again (rlherd package RUN -o {path} "
                              "--overwrite)")  # fmt: skip
    record = read_record(path)
    made = read_json(path / CONFIG_FILE).get(PACKAGE_KEY)
    counters = made.get("counters", {}) if isinstance(made, dict) else {}
    if (path / SUMMARY_FILE).exists():
        read_json(path / SUMMARY_FILE)  # damaged: one line now, not after the episodes
    safetensors = _safetensors()
    try:
        policy = safetensors.torch.load_file(path / POLICY_FILE)
    except (OSError, safetensors.SafetensorError) as e:
        raise ConfigError(f"{path / POLICY_FILE} is damaged ({e}); download the package again, "
                          "or package the run again") from None  # fmt: skip
    return record, {"learner": {POLICY_KEY: policy}, "recorder": {"counters": counters}}
