"""The run directory: config.json, metrics/*.csv, TensorBoard events, checkpoints, summary.json.

Files that another process may read while the run goes (summary.json, checkpoints, the latest
pointer) are written to a temporary file, synced and renamed, so a reader or a crash never sees a
half-written file.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import fcntl
import json
import os
import pickle
import re
import shutil
import stat
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlherd.config import JSON_LIMIT, run_file
from rlherd.errors import ConfigError, NodeDied, Notice
from rlherd.run.plain import from_plain, to_plain

KEEP_CHECKPOINTS = 2
PACKAGE_KEY = "package"  # a package's config.json's entry (rlherd package) that a run's lacks
# final_return_mean: the mean return of the last 20 training episodes (on the device runtime,
# of the last 20 batches' means); final_return_window: how many it holds, fewer early on.
RETURN_WINDOW = 20
# Free bytes below which a failed write is the disk's doing (torch does not say so: _torch_save).
FULL_DISK_BYTES = 64 * 2**20
CHECKPOINT_NAME = re.compile(r"ckpt-\d{12}\.pt")
SNAPSHOT_NAME = re.compile(r"snapshot-(\d{12})\.pt")
POINTER_LIMIT = 4096  # checkpoints/latest: one checkpoint's name


@dataclass(frozen=True)
class RunRecord:
    """What a run is, as its config.json records it: enough to resume it, evaluate it, record
    its policy or train it again. Only :class:`RunDir` reads and writes it; a resumed run that
    is given a longer budget or other evaluations is a ``dataclasses.replace`` of it."""

    agent: str
    env: str  # as rlherd.envs.resolve records it: module:Env-v0 where a module registers it
    runtime: str
    seed: int
    total_steps: int  # in the runtime's unit (Runtime.counts)
    env_kwargs: dict[str, Any]
    eval_every: int  # 0: no evaluations while training
    eval_episodes: int
    config: dict[str, Any]  # the agent's config fields
    settings: dict[str, Any]  # the runtime's settings
    preset: str = ""  # the preset the config started from (runs of older versions: "")
    # What it started on (rlherd.run.provenance.machine; runs of older versions: {}).
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)


# What config.json must hold, and of which type (checked before a run is evaluated or resumed):
# the record's fields without a default.
RUN_FIELDS = {f.name: typing.get_origin(kind) or kind
              for f, kind in zip(dataclasses.fields(RunRecord),
                                 typing.get_type_hints(RunRecord).values(), strict=True)
              if f.default is f.default_factory is dataclasses.MISSING}  # fmt: skip


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file, synced, then renamed); a full disk
    is :class:`DiskFull`, with the temporary file removed."""
    tmp = path.with_name(f".{path.name}.tmp")
    with _disk_full_is_one_line(path):
        try:
            tmp.unlink(missing_ok=True)  # a link left there is removed, never written through
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def open_to_write(path: Path, append: bool = False, root: Path | None = None) -> typing.TextIO:
    """A run's file ``path`` opened to write text (``append``ed to, or from empty), never
    through a link planted since the run was checked (:meth:`RunDir.check_links`): a symbolic
    or hard link, a FIFO or a device there, or a folder between ``root`` (the run's own folder,
    which may be reached through a link) and the file that is a link, is one line, and what it
    names is left untouched (the file is emptied only once it is known to be the run's own)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    refusal = ConfigError(f"{path} is a link, or in a folder that is one, or no regular file, "
                          "which writing here would write through; a run writes only its own "
                          "files: replace it with the file or folder itself")  # fmt: skip
    parts = path.relative_to(root).parts if root is not None else (path.name,)
    folder = os.open(root if root is not None else path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:  # each folder inside the run opened without following a link
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], flags | (os.O_APPEND if append else 0), 0o644, dir_fd=folder)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):  # links; a FIFO no one reads
            raise refusal from None
        raise
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise refusal
    if not append:
        os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a" if append else "w", newline="")


class CSVLogger:
    """Appends rows to a CSV file; a row with new keys rewrites the header (columns may grow)."""

    def __init__(self, path: Path, root: Path | None = None):
        self.path, self.root = path, root  # root: the run's folder (open_to_write)
        self.fields: list[str] = []
        self._file = open_to_write(path, append=True, root=root)
        if path.stat().st_size:
            with open(run_file(path), newline="") as f:
                self.fields = next(csv.reader(f), [])
        self._writer = csv.DictWriter(self._file, self.fields)

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.fields]
        if new or not self.fields:
            self._regrow(self.fields + new)
        self._writer.writerow(row)

    def _regrow(self, fields: list[str]) -> None:
        self._file.close()
        rows = []
        if self.path.exists() and run_file(self.path).stat().st_size:
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
        self.fields = fields
        with open_to_write(self.path, root=self.root) as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            writer.writerows(rows)
        self._file = open_to_write(self.path, append=True, root=self.root)
        self._writer = csv.DictWriter(self._file, self.fields)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def make_folder(path: Path, flag: str) -> Path:
    """Make ``path`` a folder, with its parents, for a command's ``flag`` (``--run-dir``,
    ``--out``, ``--kept``, ``--output``): where a file stands in the way, one line that names it
    rather than the traceback of a ``mkdir`` deep inside the command."""
    check_folder(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # no permission, a read-only disk, /proc, a dangling link in the way
        raise ConfigError(f"{flag} {path}: cannot make it ({e.strerror}); give a folder that "
                          "can be written") from e  # fmt: skip
    return path


def names_folder(path: str | os.PathLike) -> bool:
    """Whether an output path, as given, names a folder to write in: one that exists, or one
    written with a trailing separator (``-o exports/``, made if missing), which ``Path``
    drops: the name alone would otherwise become the file's."""
    return Path(path).is_dir() or str(path).endswith(("/", os.sep))


def check_given(folder: str | os.PathLike | None, flag: str) -> None:
    """Refuse an empty ``flag`` (``--out "$OUT"`` with ``OUT`` unset), which ``Path`` reads as
    the working directory: what the command writes would go wherever it was typed."""
    if folder is not None and not str(folder).strip():
        raise ConfigError(f"{flag} is empty; give a folder (an unset variable?)")


def check_folder(path: Path, flag: str) -> None:
    """:func:`make_folder`'s refusal without making anything: for a command that checks all its
    folders before it makes any of them."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ConfigError(f"{flag} {path}: {blocker} is a file; give a folder (made if missing)")


class RunDir:
    """One run's directory; see DESIGN.md, "Runs"."""

    def __init__(self, path: str | os.PathLike, create: bool = False):
        """Open the run directory at ``path``; ``create=True`` makes it (for a new run)."""
        self.path = Path(path)
        self.metrics_dir = self.path / "metrics"
        self.checkpoint_dir = self.path / "checkpoints"
        if not create and self.path.is_file():  # its config.json, say
            raise FileNotFoundError(f"{self.path} is a file; give the run directory, the folder "
                                    f"that holds it ({self.path.parent})")  # fmt: skip
        if not create and not (self.path / "config.json").exists():
            runs = sorted(config.parent.name for config in self.path.glob("*/config.json"))
            held = (f"; it holds runs ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}):"
                    f" give one, e.g. {self.path / runs[0]}" if runs else "")  # a --seeds parent
            raise FileNotFoundError(f"{self.path} is not an rlherd run directory (no config.json)"
                                    f"{held}")  # fmt: skip
        if create:  # opening one makes nothing: reading a run (eval, report) never writes in it
            for d in (self.path, self.metrics_dir, self.checkpoint_dir):
                d.mkdir(parents=True, exist_ok=True)
        self._csv: dict[str, CSVLogger] = {}
        self._tb = None
        self._tb_tried = False
        self._lock = None
        self.loaded: Path | None = None  # the checkpoint load_checkpoint read: messages name it

    def lock(self) -> None:
        """Hold this run's lock until the process ends or :meth:`unlock`: two processes never
        train one run directory at once, and a lock that no live process holds marks a run
        whose process died (even by SIGKILL: the system drops its locks). A run to be written is
        first checked for links out of it (:meth:`check_links`)."""
        self.check_links()
        # Held open: the lock lasts as long. Never through a link, never truncating.
        fd = os.open(self.path / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._lock = os.fdopen(fd, "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.unlock()
            raise ConfigError(f"{self.path} is in use by another rlherd process; wait for it to "
                              "end, or choose another --run-dir") from None  # fmt: skip

    def check_links(self) -> None:
        """Refuse a run holding a link to anything outside it, before anything writes into it:
        training writes, prunes and rewrites the run's files (checkpoints, metrics, its lock) in
        place, and eval its summary and a game's ratings, so a shared run's ``checkpoints``
        linked to another folder had that folder's files deleted, and a linked
        ``metrics/train.csv``, ``.lock`` or ``.summary.json.tmp`` rewrote the file it named (a
        hard link the same)."""
        inside = self.path.resolve()
        for folder, dirs, files in os.walk(self.path):
            for name in dirs + files:
                path = Path(folder) / name
                if path.is_symlink() and not path.resolve().is_relative_to(inside):
                    raise ConfigError(
                        f"{path} links to {path.resolve()}, outside the run directory; a run "
                        "writes only inside itself: replace the link with what it names"
                    )
                if not path.is_symlink() and path.is_file() and path.stat().st_nlink > 1:
                    raise ConfigError(f"{path} is a hard link, a file with another name, which "
                                      "writing here would change too: replace it with a copy")

    def in_use(self) -> bool:
        """Whether another process holds this run's lock (:meth:`lock`): the run is training
        now. Only asked, so that a reader can tell a run still on its way to its first
        checkpoint from one that stopped before it; the lock file is opened to read, never
        made."""
        if self._lock is not None:  # ours
            return False
        try:  # never through a link; a FIFO planted as .lock does not block the open
            fd = os.open(self.path / ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # no lock file: no process ever trained here
            return False
        with os.fdopen(fd) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        return False

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # config and summary -------------------------------------------------------------------
    def write_config(self, record: RunRecord) -> None:
        atomic_write_json(self.path / "config.json", dataclasses.asdict(record))

    def read_config(self) -> RunRecord:
        """The run's record (:func:`read_record`)."""
        return read_record(self.path)

    def read_summary(self) -> dict[str, Any]:
        """The run's summary.json (empty before the run's first summary)."""
        path = self.path / "summary.json"
        return read_json(path) if path.exists() else {}

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.path / "summary.json", summary)

    # metrics ------------------------------------------------------------------------------
    def log(self, source: str, row: dict[str, Any], step: int) -> None:
        """Append ``row`` to ``metrics/<source>.csv`` and to TensorBoard as ``source/key``."""
        if source not in self._csv:
            self.metrics_dir.mkdir(exist_ok=True)  # a run continued without it (deleted)
            self._csv[source] = CSVLogger(self.metrics_dir / f"{source}.csv", root=self.path)
        with _disk_full_is_one_line(self._csv[source].path):
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
                    Notice,
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
            with open(run_file(path), newline="") as f:
                reader = csv.DictReader(f)
                fields = reader.fieldnames or []
                rows = [r for r in reader if int(r.get(counts) or 0) <= steps]
            with open_to_write(path, root=self.path) as f:
                writer = csv.DictWriter(f, fields)
                writer.writeheader()
                writer.writerows(rows)

    # checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any], step: int) -> Path:
        """Write ``checkpoints/ckpt-<step>.pt`` atomically (as plain data: :mod:`rlherd.run.plain`),
        point ``latest`` at it, prune old. A full disk stops the run with :class:`DiskFull`;
        the previous checkpoint stays ``latest``, and no temporary file is left."""
        path = self.checkpoint_dir / f"ckpt-{step:012d}.pt"
        plain = to_plain(state)
        with _disk_full_is_one_line(path):
            self.checkpoint_dir.mkdir(exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                _torch_save(plain, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            atomic_write_bytes(self.checkpoint_dir / "latest", path.name.encode())
        for old in sorted(self.checkpoint_dir.glob("ckpt-*.pt"))[:-KEEP_CHECKPOINTS]:
            old.unlink()
        return path

    # snapshots of the policy (self-play) -------------------------------------------------------
    def save_snapshot(self, policy: dict[str, Any], step: int) -> Path:
        """Write the policy's parameters at ``step`` as ``snapshots/snapshot-<step>.pt``
        (atomically, as plain data): the past selves ``rlherd eval --opponent snapshot:K``
        plays against."""
        (self.path / "snapshots").mkdir(exist_ok=True)
        return _save_policy(policy, self.snapshot_file(step))

    def snapshot_file(self, step: int) -> Path:
        return self.path / "snapshots" / f"snapshot-{step:012d}.pt"

    def snapshots(self) -> list[int]:
        """The steps of the run's policy snapshots, oldest first."""
        folder = self.path / "snapshots"
        names = (SNAPSHOT_NAME.fullmatch(p.name) for p in folder.glob("snapshot-*.pt"))
        return sorted(int(m.group(1)) for m in names if m)

    def load_snapshot(self, step: int) -> dict[str, Any]:
        """The policy's parameters at ``step`` (plain data only: nothing in it can run code)."""
        if step not in self.snapshots():
            have = ", ".join(map(str, self.snapshots())) or "none"
            raise ConfigError(f"{self.path} has no snapshot at step {step} (it has: {have})")
        return _read_policy(self.snapshot_file(step), "delete it, or train the run again")

    # the best evaluation's policy (rlherd.run.callbacks.SaveBest) ----------------------------
    def save_best(self, policy: dict[str, Any], evaluation: dict[str, Any]) -> None:
        """Keep ``policy`` as the run's best (``best/policy.pt``, plain data) with the
        ``evaluation`` that made it so (``best/evaluation.json``, written after the policy)."""
        folder = self.path / "best"
        folder.mkdir(exist_ok=True)
        _save_policy(policy, folder / "policy.pt")
        atomic_write_json(folder / "evaluation.json", evaluation)

    def load_best(self) -> dict[str, Any]:
        """The best evaluation's policy parameters (plain data only: nothing in it can run
        code)."""
        path = self.path / "best" / "policy.pt"
        if not path.exists():
            raise ConfigError(f"{self.path} has no best policy ({path}); train it with "
                              "--save-best (or the SaveBest callback) and evaluations")
        return _read_policy(path, "delete best/, or train the run again")

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``latest`` names. It may only name a ``ckpt-<step>.pt`` file of this
        run's ``checkpoints/`` (a crafted pointer to a file elsewhere is refused)."""
        pointer = self.checkpoint_dir / "latest"
        if not pointer.exists():
            return None
        name = run_file(pointer, POINTER_LIMIT).read_bytes().decode(errors="replace").strip()
        if not CHECKPOINT_NAME.fullmatch(name):
            raise ConfigError(
                f"{pointer} names {name[:80]!r}, not a checkpoint of this run "
                "(checkpoints/ckpt-<step>.pt); delete it to use the newest checkpoint there"
            )
        return self.checkpoint_dir / name

    def refuse_copy(self) -> None:
        """Refuse a copy of a run's record and results without its ``checkpoints/`` (as a bsuite
        sweep's ``--kept`` folder keeps): it has no policy or state to load or continue."""
        if not self.checkpoint_dir.exists() and (self.path / "summary.json").exists():
            raise FileNotFoundError(
                f"{self.path} holds a run's record and results without its checkpoints/ (a "
                "copy, as a bsuite sweep's --kept folder keeps): no policy or state to load; "
                "give the run it was copied from"
            )

    def load_checkpoint(self) -> dict[str, Any]:
        """The newest readable checkpoint: the one ``latest`` names, or (with a warning naming
        the bad file) an older one beside it if that one is truncated, empty or missing. Read
        as plain data only: nothing in it can run code."""
        latest = self.latest_checkpoint()
        older = sorted(self.checkpoint_dir.glob("ckpt-*.pt"), reverse=True)
        candidates = ([latest] if latest is not None else []) + [p for p in older if p != latest]
        if not candidates:
            if self.in_use():
                raise FileNotFoundError(
                    f"no checkpoint in {self.checkpoint_dir} yet: the run is still training, "
                    "and writes one every checkpoint_interval_s (60 s unless set) and at its "
                    "end; try again then"
                )
            self.refuse_copy()
            raise FileNotFoundError(
                f"no checkpoint in {self.checkpoint_dir}; the run stopped before its first one"
            )
        inside = self.checkpoint_dir.resolve()
        for path in candidates:
            if path.exists() and path.resolve().parent != inside:
                raise ConfigError(f"{path} links to {path.resolve()}, outside the run directory; "
                                  "replace the link with the file itself")  # fmt: skip
            try:
                state = torch.load(run_file(path), weights_only=True, map_location="cpu")
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, ConfigError) as e:
                if "weights_only" in str(e) or "Unsupported global" in str(e):
                    raise ConfigError(
                        f"{path} holds pickled Python objects (rlherd's checkpoint format before "
                        "plain data); rlherd does not load those, since loading them can run "
                        "code: train the run again"
                    ) from None
                warnings.warn(f"checkpoint {path} is unreadable ({e}); trying an older one",
                              Notice, stacklevel=2)  # fmt: skip
            else:
                if not isinstance(state, dict):
                    raise ConfigError(f"{path} holds a {type(state).__name__}, not an rlherd "
                                      "checkpoint; delete it, or train the run again")  # fmt: skip
                self.loaded = path
                return from_plain(state)
        raise FileNotFoundError(
            f"no readable checkpoint in {self.checkpoint_dir} (tried "
            f"{', '.join(p.name for p in candidates)}); the run cannot be resumed"
        )


def check_parts(checkpoint: dict[str, Any], path: Path) -> None:
    """A run's checkpoint (read from ``path``) holds what every reader takes (eval, resume,
    package): its learner's state and its step counters, numbers. One that lacks them (an empty
    dict, a crafted file) is one line, not a ``KeyError`` where a reader first looks."""
    recorder = checkpoint.get("recorder")
    counters = recorder.get("counters") if isinstance(recorder, dict) else None
    if not (isinstance(checkpoint.get("learner"), dict) and isinstance(counters, dict)
            and all(type(v) in (int, float) for v in counters.values())):  # fmt: skip
        raise ConfigError(f"{path} lacks a learner's state or the run's step counters, so it is "
                          "not a checkpoint of this run; delete it to use an older one, or "
                          "train the run again")  # fmt: skip


@contextlib.contextmanager
def fitting(path: Path | None) -> Iterator[None]:
    """Restoring a run's state or policy from the file at ``path``: a part that does not fit
    what the run's config builds (tensors of other shapes, as after config.json's network sizes
    were edited, or an environment of one's own changed its spaces; a part missing; a value of
    the wrong type, a random state of another generator) is one line naming the file, not the
    traceback of a ``load_state_dict`` deep in torch or numpy. Only restoring goes in here: a
    fault of the run itself keeps its traceback."""
    try:
        yield
    except (ConfigError, torch.OutOfMemoryError, NodeDied):  # RuntimeErrors, not misfits
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
        if "can't allocate memory" in str(e):  # the CPU allocator's out of memory
            raise
        raise ConfigError(f"{path} does not fit the run's config ({_gist(e)}); was config.json "
                          "edited after training, or have the environment's spaces changed "
                          "since (its code, or its options)? Restore the run's files, or the "
                          "environment, from a copy, or train the run again") from None  # fmt: skip


def _gist(error: Exception) -> str:
    """What ``error`` says in one line: torch's ``load_state_dict`` says it on its second
    ("Error(s) in loading state_dict for DQNNetwork:" then "size mismatch for ...")."""
    if isinstance(error, KeyError):
        return f"it has no {error.args[0]!r}" if error.args else "a part is missing"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    line = lines[1] if lines[0].startswith("Error(s) in loading") and len(lines) > 1 else lines[0]
    return f"{type(error).__name__}: {line[:300]}"


def _read_policy(path: Path, fix: str) -> dict[str, Any]:
    """A policy's parameters that :func:`_save_policy` wrote, as plain data (nothing in it can
    run code); a link out of its folder, or a file that holds no such parameters, is one line
    that says how to ``fix`` it."""
    if path.resolve().parent != path.parent.resolve():
        raise ConfigError(f"{path} links outside the run directory; replace the link with the "
                          "file itself")  # fmt: skip
    try:
        policy = torch.load(run_file(path), weights_only=True, map_location="cpu")
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        pickled = "weights_only" in str(e) or "Unsupported global" in str(e)
        why = "pickled Python objects, which rlherd does not load" if pickled else _gist(e)
        raise ConfigError(f"{path} is not a policy rlherd wrote ({why}); {fix}") from None
    if not isinstance(policy, dict):
        raise ConfigError(f"{path} holds a {type(policy).__name__}, not a policy's parameters; "
                          f"{fix}")  # fmt: skip
    return from_plain(policy)


def _save_policy(policy: dict[str, Any], path: Path) -> Path:
    """Write a policy's parameters to ``path`` atomically, as plain data."""
    tmp = path.with_name(f".{path.name}.tmp")
    with _disk_full_is_one_line(path):
        try:
            _torch_save(to_plain(policy), tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def read_record(folder: Path) -> RunRecord:
    """The record in ``folder/config.json`` (a run directory's, or a package's: a function, not
    a :class:`RunDir` method, since opening a RunDir makes its folders), each field checked; an
    environment it names by module must be an installed one (see
    :func:`rlherd.envs.check_recorded`)."""
    from rlherd import envs as rl_envs

    path = folder / "config.json"
    config = read_json(path)
    for key, kind in RUN_FIELDS.items():
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            got = "missing" if key not in config else f"a {type(config[key]).__name__}"
            raise ConfigError(
                f"{path}: {key!r} is {got}, not a {kind.__name__}; the file is damaged or "
                "not rlherd's: restore it from a copy of the run, or train the run again"
            )
    rl_envs.check_recorded(config["env"], folder)
    _check_written_where(path, rl_envs.family(config["env"]), config["env_kwargs"], folder)
    preset = config.get("preset") if isinstance(config.get("preset"), str) else ""
    machine = config.get("machine") if isinstance(config.get("machine"), dict) else {}
    return RunRecord(**{key: config[key] for key in RUN_FIELDS}, preset=preset,
                     machine=machine)  # fmt: skip


def _check_written_where(path: Path, family: str, env_kwargs: dict[str, Any], folder: Path) -> None:
    """Refuse a record whose environment options would have it write files outside the run, in
    a folder the run's sharer chose: bsuite's CSV (``results_dir``, which only the run itself
    sets, and ``overwrite``), NetHack's game recordings (``savedir``, which one may keep inside
    the run; with ``save_ttyrec_every`` and no ``savedir``, NLE writes them into the working
    directory)."""
    from rlherd.envs.bsuite import RUN_OPTIONS

    if family == "bsuite" and RUN_OPTIONS & set(env_kwargs):
        raise ConfigError(f"{path}: env_kwargs names results_dir or overwrite, where bsuite "
                          "writes its CSV, which only the run itself sets (its own folder); "
                          "drop them")  # fmt: skip
    if family != "nethack":
        return
    savedir = env_kwargs.get("savedir")
    if savedir is None and env_kwargs.get("save_ttyrec_every"):  # NLE's default: ./nle_data
        raise ConfigError(f"{path}: env_kwargs' save_ttyrec_every has NetHack record games in "
                          "the working directory's nle_data, outside the run: name a savedir "
                          "inside the run, or drop it")  # fmt: skip
    if savedir is not None and not (isinstance(savedir, str) and savedir and Path(
            savedir).resolve().is_relative_to(folder.resolve())):  # fmt: skip
        raise ConfigError(f"{path}: env_kwargs' savedir {savedir!r}, where NetHack writes its "
                          "game recordings, is no folder inside the run: drop it, or name one "
                          "inside the run")  # fmt: skip


class DiskFull(ConfigError):
    """A run's file could not be written for want of space."""


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save``, a full disk raising ``OSError`` (ENOSPC) as any other write does: torch's
    zip writer reports a write the disk had no room for as a ``RuntimeError`` ("unexpected
    pos"), told apart here by the disk's free space, read while the partial file is there."""
    try:
        torch.save(obj, path)
    except RuntimeError:
        if shutil.disk_usage(path.parent).free >= FULL_DISK_BYTES:
            raise  # not the disk: a fault to see whole
        raise OSError(errno.ENOSPC, "No space left on device", str(path)) from None


@contextlib.contextmanager
def _disk_full_is_one_line(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFull(f"no space left to write {path}; free some space and continue with "
                       f"rlherd train --resume {path.parent.parent}") from None  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    """A run file holding a JSON object; anything else (missing, empty, not JSON, not an
    object) is one line naming the file."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {path.parent} an rlherd run directory?")
    data = run_file(path, JSON_LIMIT).read_bytes()
    try:
        value = json.loads(data.decode())
    # ValueError: not JSON, or an int of more digits than Python converts; RecursionError:
    # arrays nested deeper than the parser goes
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); restore it from a copy of the run, "
                          "or train the run again") from None  # fmt: skip
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds a JSON {type(value).__name__}, not an object; restore it "
                          "from a copy of the run, or train the run again")  # fmt: skip
    return value
