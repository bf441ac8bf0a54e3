"""Checkpoints as plain data, and environment snapshots sealed with a key of this machine.

A run directory is something researchers share, so loading one must never run code from it.
Checkpoints are read with ``torch.load(weights_only=True)``, whose unpickler builds only tensors,
numbers, strings, bytes, ``None`` and lists, tuples and dicts of them. :func:`to_plain` turns the
rest of what rlherd checkpoints (numpy arrays and scalars, deques) into those before saving, and
:func:`from_plain` turns them back after loading.

One thing cannot be plain data: the environments' own state (a Gymnasium vector env pickled
whole), which makes ``--resume`` continue mid-episode exactly. :func:`seal` signs those bytes with
an HMAC key kept outside every run directory (``$RLHERD_SNAPSHOT_KEY``, by default
``~/.config/rlherd/snapshot.key``, made on first use). :func:`unseal` returns them only when the
signature is this key's: a snapshot from another machine, or a forged one, is never unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

KEY_ENV = "RLHERD_SNAPSHOT_KEY"
_NUMPY = "__numpy__"  # a dict {_NUMPY: tensor, "scalar": bool} stands for a numpy value
_DTYPE = "__dtype__"  # a dict {_DTYPE: "<f4"} stands for a numpy dtype


# to_plain shares read-only arrays with torch only to save them (see below), never to write.
# A filter, not catch_warnings around the call: that swaps the process's filters, which other
# threads (a run's actors) may be using while a checkpoint is written.
warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning,
                        r"rlherd\.run\.plain")  # fmt: skip


def to_plain(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` with numpy arrays and scalars as tensors (their dtype kept), numpy dtypes as
    their names and deques as lists, so that ``torch.load(weights_only=True)`` reads it back.
    Anything else that is not plain data is a bug in what a component checkpoints: a TypeError
    names where it is."""
    if isinstance(obj, np.ndarray | np.generic):  # first: np.float64 is also a float
        array = np.asarray(obj)
        if array.dtype == object:
            raise TypeError(f"{where} is a numpy array of Python objects, which is not plain data")
        # Shared, not copied, where torch can share it: a checkpoint is written at once, in this
        # thread, and its bulk is the replay tables' items, already a copy (taken under each
        # table's lock), which a second copy would double. Read-only arrays too (a distributed
        # run's tables arrive read-only from Ray's object store): saving only reads them, so
        # torch's warning that writing to them is undefined does not apply (it is filtered
        # below). (copy, not ascontiguousarray: 0-d stays 0-d.)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        tensor = torch.from_numpy(array)
        if array.size == 0:  # nothing to share, and its address may start another array of
            tensor = torch.empty_like(tensor)  # another dtype, which torch.save refuses
        return {_NUMPY: tensor, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, np.dtype):
        return {_DTYPE: obj.str}
    if isinstance(obj, torch.Tensor | int | float | str | bytes | None):
        return obj  # bool is an int
    if isinstance(obj, dict):
        return {k: to_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list | deque):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{where} is a {type(obj).__name__}, which a checkpoint cannot hold")


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain` (deques come back as lists, which their owners accept)."""
    if isinstance(obj, dict):
        if _NUMPY in obj:
            array = obj[_NUMPY].numpy()
            return array[()] if obj["scalar"] else array
        if _DTYPE in obj:
            return np.dtype(obj[_DTYPE])
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj


def key_path() -> Path:
    """Where this machine's snapshot key lives: ``$RLHERD_SNAPSHOT_KEY``, or the user's config
    folder (never a run directory, which is what gets shared)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "rlherd" / "snapshot.key"


def _key() -> bytes:
    """The key, made on first use (readable by its owner only). ``O_EXCL`` decides between two
    processes making it at once; the loser reads the winner's."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
    return path.read_bytes()


def seal(data: bytes) -> dict[str, Any]:
    """``data`` with its HMAC-SHA256 under this machine's key."""
    return dict(data=data, hmac=hmac.new(_key(), data, hashlib.sha256).hexdigest())


def unseal(sealed: Any) -> bytes | None:
    """The bytes :func:`seal` sealed, if this machine's key sealed them; otherwise None."""
    if not isinstance(sealed, dict) or not isinstance(sealed.get("data"), bytes):
        return None
    expected = hmac.new(_key(), sealed["data"], hashlib.sha256).hexdigest()
    return sealed["data"] if hmac.compare_digest(expected, str(sealed.get("hmac"))) else None
