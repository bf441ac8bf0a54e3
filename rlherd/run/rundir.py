"""The run directory: config.json, metrics/*.csv, TensorBoard events, checkpoints, summary.json.

Files that another process may read while the run goes (summary.json, checkpoints, the latest
pointer) are written to a temporary file, synced and renamed, so a reader or a crash never sees a
half-written file.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

KEEP_CHECKPOINTS = 2


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


class CSVLogger:
    """Appends rows to a CSV file; a row with new keys rewrites the header (columns may grow)."""

    def __init__(self, path: Path):
        self.path = path
        self.fields: list[str] = []
        if path.exists():
            with open(path, newline="") as f:
                self.fields = next(csv.reader(f), [])
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, self.fields)

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.fields]
        if new or not self.fields:
            self._regrow(self.fields + new)
        self._writer.writerow(row)

    def _regrow(self, fields: list[str]) -> None:
        self._file.close()
        rows = []
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
        self.fields = fields
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            writer.writerows(rows)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, self.fields)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class RunDir:
    """One run's directory; see DESIGN.md, "Runs"."""

    def __init__(self, path: str | os.PathLike, create: bool = False):
        """Open the run directory at ``path``; ``create=True`` makes it (for a new run)."""
        self.path = Path(path)
        self.metrics_dir = self.path / "metrics"
        self.checkpoint_dir = self.path / "checkpoints"
        if not create and not (self.path / "config.json").exists():
            raise FileNotFoundError(f"{self.path} is not an rlherd run directory (no config.json)")
        for d in (self.path, self.metrics_dir, self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._csv: dict[str, CSVLogger] = {}
        self._tb = None
        self._tb_tried = False

    # config and summary -------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_json(self.path / "config.json", config)

    def read_config(self) -> dict[str, Any]:
        """The run's config; an environment it names by module must be an installed one (see
        :func:`rlherd.envs.check_recorded`)."""
        from rlherd import envs as rl_envs

        config = read_json(self.path / "config.json")
        rl_envs.check_recorded(str(config.get("env", "")), self.path)
        return config

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.path / "summary.json", summary)

    # metrics ------------------------------------------------------------------------------
    def log(self, source: str, row: dict[str, Any], step: int) -> None:
        """Append ``row`` to ``metrics/<source>.csv`` and to TensorBoard as ``source/key``."""
        if source not in self._csv:
            self._csv[source] = CSVLogger(self.metrics_dir / f"{source}.csv")
        self._csv[source].write(row)
        tb = self._tensorboard()
        if tb is not None:
            for key, value in row.items():
                if isinstance(value, int | float) and key not in ("actor_steps", "learner_steps"):
                    tb.add_scalar(f"{source}/{key}", value, step)

    def _tensorboard(self):
        if not self._tb_tried:
            self._tb_tried = True
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path / "tb"))
            except ImportError:
                warnings.warn(
                    "tensorboard is not installed, so no event files are written; "
                    "pip install 'rlherd[tb]' to get them",
                    stacklevel=2,
                )
        return self._tb

    def flush(self) -> None:
        for logger in self._csv.values():
            logger.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        for logger in self._csv.values():
            logger.close()
        self._csv.clear()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def truncate_metrics(self, steps: int, counts: str = "actor_steps") -> None:
        """Drop metric rows written after the checkpoint that a resumed run continues from, at
        ``steps`` of ``counts``."""
        for path in self.metrics_dir.glob("*.csv"):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                fields = reader.fieldnames or []
                rows = [r for r in reader if int(r.get(counts) or 0) <= steps]
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fields)
                writer.writeheader()
                writer.writerows(rows)

    # checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any], step: int) -> Path:
        """Write ``checkpoints/ckpt-<step>.pt`` atomically, point ``latest`` at it, prune old."""
        path = self.checkpoint_dir / f"ckpt-{step:012d}.pt"
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        atomic_write_bytes(self.checkpoint_dir / "latest", path.name.encode())
        for old in sorted(self.checkpoint_dir.glob("ckpt-*.pt"))[:-KEEP_CHECKPOINTS]:
            old.unlink()
        return path

    def latest_checkpoint(self) -> Path | None:
        pointer = self.checkpoint_dir / "latest"
        if not pointer.exists():
            return None
        return self.checkpoint_dir / pointer.read_text().strip()

    def load_checkpoint(self) -> dict[str, Any]:
        """The newest readable checkpoint: the one ``latest`` names, or (with a warning naming
        the bad file) an older one beside it if that one is truncated, empty or missing."""
        latest = self.latest_checkpoint()
        older = sorted(self.checkpoint_dir.glob("ckpt-*.pt"), reverse=True)
        candidates = ([latest] if latest is not None else []) + [p for p in older if p != latest]
        if not candidates:
            raise FileNotFoundError(
                f"no checkpoint in {self.checkpoint_dir}; the run stopped before its first one"
            )
        for path in candidates:
            try:
                # Our own files, written by save_checkpoint: they hold numpy RNG states and
                # pickled environments, so full unpickling is needed.
                return torch.load(path, weights_only=False, map_location="cpu")
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
                warnings.warn(f"checkpoint {path} is unreadable ({e}); trying an older one",
                              stacklevel=2)  # fmt: skip
        raise FileNotFoundError(
            f"no readable checkpoint in {self.checkpoint_dir} (tried "
            f"{', '.join(p.name for p in candidates)}); the run cannot be resumed"
        )


def read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {path.parent} an rlherd run directory?")
    return json.loads(path.read_text())
