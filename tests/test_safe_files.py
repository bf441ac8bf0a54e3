"""A run directory is safe to share and every bad file is one line: no code runs from a
checkpoint or an environment snapshot, paths stay inside the run, damaged run files and
datasets are refused before anything runs, a full disk keeps the last good checkpoint, and runs
end honestly (Ctrl-C, a finished run, a crashed start)."""

from __future__ import annotations

import json
import os
import pickle
import queue
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch

import rlherd
import rlherd.commands.evaluate
import rlherd.run.rundir
from rlherd.cli import main
from rlherd.commands.plot import load_curves
from rlherd.envs.proto import env_server_pb2 as pb
from rlherd.envs.server import METHOD, serve
from rlherd.errors import ConfigError, NodeDied
from rlherd.run.loop import SnapshotNotice
from rlherd.run.plain import KEY_ENV, from_plain, seal, to_plain
from rlherd.run.rundir import CSVLogger, RunDir, fitting

STEPS = 400


class _Runs:
    """Code that a crafted pickle runs: it creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _trained(path, steps: int = STEPS):
    """A small finished DQN run on CartPole (its checkpoint holds an environment snapshot)."""
    return rlherd.train("dqn", "CartPole-v1", total_steps=steps, run_dir=path, progress=False,
                        checkpoint_interval_s=0.0)  # fmt: skip


def _latest(path):
    return path / "checkpoints" / (path / "checkpoints" / "latest").read_text()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _command(name, run_dir, tmp_path) -> list[str]:
    """The arguments of the command ``name`` on ``run_dir`` (its outputs under ``tmp_path``)."""
    return {
        "eval": ["eval", str(run_dir)],
        "resume": ["train", "--resume", str(run_dir), "--total-steps", str(2 * STEPS)],
        "plot": ["plot", str(run_dir), "-o", str(tmp_path / "curves.png")],
        "package": ["package", str(run_dir), "-o", str(tmp_path / "package"), "--no-video"],
        "config": ["train", "--config", str(run_dir / "config.json"), "--run-dir",
                   str(tmp_path / "again")],
    }[name]


def _no_episodes(monkeypatch):
    """Fail the test if any evaluation episode runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("an episode ran before the run's files were checked")

    monkeypatch.setattr(rlherd.commands.evaluate, "run_episodes", refuse)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("finished") / "run").path


@pytest.fixture
def run_copy(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def test_checkpoints_round_trip_as_plain_data():
    state = {"a": np.arange(6, dtype=np.uint16).reshape(2, 3).T, "b": np.float32(2.5),
             "c": np.array(7), "d": (np.dtype("<f4"), [np.bool_(True), 3, "s", b"x", None]),
             "e": torch.ones(2), "g": np.frombuffer(b"\x01\x02", np.uint8)}  # fmt: skip
    plain = to_plain(state)
    back = from_plain(plain)
    assert back["g"].tolist() == [1, 2]
    # A contiguous array is shared (a replay table's items are not copied twice), read-only
    # ones too (a distributed run's tables, from Ray's object store: "g"); a strided one is
    # copied into the contiguous memory torch saves.
    shared = np.ones(4, np.float32)
    assert to_plain(shared)["__numpy__"].data_ptr() == shared.ctypes.data
    assert plain["g"]["__numpy__"].data_ptr() == state["g"].ctypes.data
    assert plain["a"]["__numpy__"].data_ptr() != state["a"].ctypes.data
    assert back["a"].dtype == np.uint16 and (back["a"] == state["a"]).all()
    assert type(back["b"]) is np.float32 and back["b"] == 2.5
    assert back["c"].shape == () and back["c"] == 7
    assert back["d"][0] == np.dtype("<f4") and back["d"][1] == [True, 3, "s", b"x", None]
    with pytest.raises(TypeError, match=r"checkpoint\['f'\] is a object"):
        to_plain({"f": object()})


def test_sharing_a_read_only_array_for_a_checkpoint_warns_nobody():
    """torch warns that writing to a tensor of a read-only array is undefined; a checkpoint
    only reads it. (In a fresh process: torch warns once per process, whatever the filters.)"""
    code = ("import numpy as np; from rlherd.run.plain import to_plain; "
            "to_plain(np.frombuffer(b'12', np.uint8))")  # fmt: skip
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]


def test_an_empty_array_at_another_arrays_address_checkpoints(tmp_path):
    """Arrays read from one buffer (a distributed run's tables, from Ray's object store): an
    empty one starts where the next begins; shared as tensors of two dtypes at one address,
    torch.save refused them ("view the same data as different types")."""
    raw = bytearray(16)
    empty = np.frombuffer(raw, dtype=np.int64, count=0)
    after = np.frombuffer(raw, dtype=np.float32, count=4)
    torch.save(to_plain({"keys": empty, "priorities": after}), tmp_path / "ckpt.pt")
    back = from_plain(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    assert back["keys"].dtype == np.int64 and back["keys"].shape == (0,)
    assert back["priorities"].tolist() == [0.0] * 4


@pytest.mark.parametrize("command", ["eval", "resume", "collect"])
def test_a_crafted_checkpoint_runs_no_code(command, run_copy, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "pwned"
    torch.save({"learner": _Runs(marker)}, _latest(run_copy))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    args = {"eval": ["eval", str(run_copy)],
            "resume": ["train", "--resume", str(run_copy), "--total-steps", str(2 * STEPS)],
            "collect": ["collect", str(run_copy), "--out", "crafted/run-v0", "--episodes", "1"],
            }[command]  # fmt: skip
    assert main(args) == 2
    assert not marker.exists()
    assert "holds pickled Python objects" in _one_line(capsys)


@pytest.mark.parametrize("command", ["eval", "resume", "collect", "export", "package",
                                     "config", "load_policy"])  # fmt: skip
def test_a_run_naming_a_function_that_is_no_environment_factory_runs_no_code(
        command, run_copy, tmp_path, capsys, monkeypatch):  # fmt: skip
    """A run's config.json is a file anyone may write: its environment ``os:system`` with the
    option ``command`` ran that command in every command that loads the run, and
    ``runpy:run_path`` ran a script shipped in the run."""
    marker = tmp_path / "pwned"
    (run_copy / "payload.py").write_text(f"open({str(marker)!r}, 'w')\n")
    with open(run_copy / "payload.npy", "wb") as f:
        pickle.dump(_Runs(marker), f)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    config = json.loads((run_copy / "config.json").read_text())
    stdlib = "where no environment lives (the standard library"
    for env, options, says in (
            ("os:system", {"command": f"touch {marker}"}, stdlib),
            ("runpy:run_path", {"path_name": str(run_copy / "payload.py")}, stdlib),
            ("numpy:load", {"file": str(run_copy / "payload.npy"), "allow_pickle": True},
             "not marked as an environment factory")):  # fmt: skip
        (run_copy / "config.json").write_text(json.dumps(
            {**config, "env": env, "env_kwargs": options}))  # fmt: skip
        args = {"eval": ["eval", str(run_copy)],
                "resume": ["train", "--resume", str(run_copy), "--total-steps", str(2 * STEPS)],
                "collect": ["collect", str(run_copy), "--out", "crafted/run-v0", "--episodes", "1"],
                "export": ["export", str(run_copy), "-o", str(tmp_path / "policy.onnx")],
                "package": ["package", str(run_copy), "-o", str(tmp_path / "pkg"), "--no-video"],
                "config": ["train", "--config", str(run_copy / "config.json"), "--run-dir",
                           str(tmp_path / "again")],
                }.get(command)  # fmt: skip
        if args is None:
            with pytest.raises(ConfigError, match=re.escape(says)):
                rlherd.load_policy(run_copy)
        else:
            assert main(args) == 2
            assert says in _one_line(capsys)
        assert not marker.exists()


def test_a_run_never_names_a_module_that_runs_code_of_its_choosing(run_copy, tmp_path, capsys,
                                                                   monkeypatch):  # fmt: skip
    """Any installed module's top-level code ran (``venv.__main__`` made a virtualenv)."""
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "env": "venv.__main__:Env-v0"}))
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(run_copy)]) == 2
    assert "where no environment lives" in _one_line(capsys)
    assert not (tmp_path / "eval").exists()


def test_a_namespace_package_never_imports_its_submodule_from_the_run(run_copy, tmp_path):
    """A namespace package (mujoco) looks for its submodules on the whole import path, the run's
    folder first under ``python -m`` there: a run's own ``mujoco/pwned.py`` was imported. (In a
    fresh process: one that imported mujoco before never looks there.)"""
    (run_copy / "mujoco").mkdir()
    (run_copy / "mujoco" / "pwned.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w')\n")
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "env": "mujoco.pwned:Pwned-v0"}))
    out = subprocess.run([sys.executable, "-m", "rlherd.cli", "eval", "."], cwd=run_copy,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "would import 'mujoco.pwned' from inside the run directory" in out.stderr
    assert not (tmp_path / "pwned").exists()


def test_a_pettingzoo_id_never_imports_a_module_from_the_run(run_copy, tmp_path, capsys,
                                                             monkeypatch):  # fmt: skip
    """``pettingzoo/<module>`` names a module as ``module:Env-v0`` does: one in the run's own
    folder (first on the import path under ``python -m`` there) was imported."""
    (run_copy / "evil.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w')\n")
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "env": "pettingzoo/evil"}))
    monkeypatch.syspath_prepend(str(run_copy))
    assert main(["eval", str(run_copy)]) == 2
    assert "would import 'evil' from inside the run directory" in _one_line(capsys)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("link", ["checkpoints", "metrics/train.csv", ".lock"])
def test_a_run_to_train_may_not_link_out_of_itself(link, run_copy, tmp_path, capsys):
    """--resume writes, prunes and rewrites a run's files in place: a ``checkpoints`` linked to
    another folder had its checkpoints deleted, a linked ``metrics/train.csv`` was rewritten
    and a linked ``.lock`` emptied."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("ckpt-1.pt", "ckpt-2.pt", "ckpt-3.pt", "precious.csv"):
        (victim / name).write_text("999999,precious-row\n")
    target = victim if link == "checkpoints" else victim / "precious.csv"
    path = run_copy / link
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)
    assert main(["train", "--resume", str(run_copy), "--total-steps", str(2 * STEPS)]) == 2
    assert "outside the run directory; a run writes only inside itself" in _one_line(capsys)
    assert sorted(p.name for p in victim.iterdir()) == [
        "ckpt-1.pt", "ckpt-2.pt", "ckpt-3.pt", "precious.csv"]  # fmt: skip
    assert all(p.read_text() == "999999,precious-row\n" for p in victim.iterdir())


def test_a_bsuite_run_names_no_folder_of_its_own_to_write_in(run_copy, tmp_path, capsys):
    """bsuite writes its CSV where ``results_dir`` says, replacing one there with ``overwrite``:
    a run's record naming them had eval write (through a link it planted) anywhere."""
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({
        **config, "env": "bsuite/deep_sea/0",
        "env_kwargs": {"results_dir": str(tmp_path / "trap"), "overwrite": True}}))  # fmt: skip
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 2
    assert "names results_dir or overwrite" in _one_line(capsys)
    assert not (tmp_path / "trap").exists()


@pytest.mark.parametrize("savedir", ["trap", 5, None, "inside"])
def test_a_nethack_run_records_its_games_only_inside_itself(savedir, run_copy, tmp_path, capsys,
                                                            monkeypatch):  # fmt: skip
    """NetHack writes a recording of each game into ``savedir`` (without one, into the working
    directory's ``nle_data``): a run's record had eval write files where the sharer chose."""
    pytest.importorskip("nle")
    monkeypatch.chdir(tmp_path)
    config = json.loads((run_copy / "config.json").read_text())
    where = {"trap": str(tmp_path / "trap"), "inside": str(run_copy / "games"), None: None}.get(
        savedir, 5)  # fmt: skip
    (run_copy / "config.json").write_text(json.dumps({
        **config, "env": "NetHackScore-v0",
        "env_kwargs": {"savedir": where, "save_ttyrec_every": 1}}))  # fmt: skip
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 2  # a CartPole run's checkpoint
    assert ("savedir" in _one_line(capsys)) == (savedir != "inside")
    assert not (tmp_path / "trap").exists() and not (tmp_path / "nle_data").exists()


@pytest.mark.parametrize("link", ["symbolic", "hard", "fifo", "folder"])
def test_a_link_planted_after_the_runs_check_is_never_written_through(link, tmp_path):
    """A run is checked for links before it is written (``check_links``); one planted in the
    moment after (on a shared folder) had its metrics appended to, or rewritten over, the file
    it named (or a file in the folder it named), and a FIFO blocked the writer for ever."""
    victims = tmp_path / "victims"
    victims.mkdir()
    for name in ("train.csv", "eval.csv"):
        (victims / name).write_text("precious\n")
    run = tmp_path / "run"
    metrics = run / "metrics"
    if link == "folder":
        run.mkdir()
        metrics.symlink_to(victims, target_is_directory=True)
    else:
        metrics.mkdir(parents=True)
    for name in ("train.csv", "eval.csv"):
        path = metrics / name
        if link == "symbolic":
            path.symlink_to(victims / name)
        elif link == "hard":
            os.link(victims / name, path)
        elif link == "fifo":
            os.mkfifo(path)
    refused = "is a link, or in a folder that is one, or no regular file"
    with pytest.raises(ConfigError, match=f"train.csv {refused}"):
        CSVLogger(metrics / "train.csv", root=run)
    if link != "folder":
        logger = CSVLogger(metrics / "fresh.csv", root=run)
        logger.write({"actor_steps": 1})
        logger.path = metrics / "eval.csv"  # one rewritten as its columns grow
        with pytest.raises(ConfigError, match=f"eval.csv ({refused}|is a FIFO)"):
            logger.write({"actor_steps": 2, "new_column": 3})
    assert [p.read_text() for p in sorted(victims.iterdir())] == ["precious\n"] * 2


def test_a_run_to_train_holds_no_hard_link(run_copy, tmp_path, capsys):
    """A metrics CSV hard-linked to a file elsewhere had --resume append to that file."""
    victim = tmp_path / "precious.csv"
    victim.write_text("999999,precious-row\n")
    (run_copy / "metrics" / "train.csv").unlink()
    os.link(victim, run_copy / "metrics" / "train.csv")
    assert main(["train", "--resume", str(run_copy), "--total-steps", str(2 * STEPS)]) == 2
    assert "is a hard link" in _one_line(capsys)
    assert victim.read_text() == "999999,precious-row\n"


def test_eval_never_writes_through_a_link_in_the_run(run_copy, tmp_path, capsys):
    """eval writes the run's summary through a temporary file, which a shared run could hold as
    a link: the file it named was replaced by the summary."""
    victim = tmp_path / "precious.txt"
    victim.write_text("precious data\n")
    (run_copy / ".summary.json.tmp").symlink_to(victim)
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 2
    assert "outside the run directory; a run writes only inside itself" in _one_line(capsys)
    assert victim.read_text() == "precious data\n"
    # A link left inside the run is removed, never written through.
    (run_copy / ".summary.json.tmp").unlink()
    (run_copy / ".summary.json.tmp").symlink_to(run_copy / "config.json")
    config = (run_copy / "config.json").read_text()
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 0
    assert (run_copy / "config.json").read_text() == config
    assert "eval_return_mean" in json.loads((run_copy / "summary.json").read_text())


def test_a_latest_pointer_outside_the_run_is_refused(run_copy, tmp_path, capsys):
    outside = tmp_path / "elsewhere.pt"
    shutil.copy(_latest(run_copy), outside)
    (run_copy / "checkpoints" / "latest").write_text("../../elsewhere.pt")
    assert main(["eval", str(run_copy)]) == 2
    assert "not a checkpoint of this run" in _one_line(capsys)
    # A checkpoint that is a link to a file elsewhere is refused too.
    (run_copy / "checkpoints" / "latest").unlink()
    for ckpt in (run_copy / "checkpoints").glob("ckpt-*.pt"):
        ckpt.unlink()
    (run_copy / "checkpoints" / "ckpt-000000000001.pt").symlink_to(outside)
    assert main(["eval", str(run_copy)]) == 2
    assert "outside the run directory" in _one_line(capsys)


def _with_snapshot(run_dir, envs):
    """Replace the sealed environment snapshot of the run's latest checkpoint with ``envs``."""
    state = RunDir(run_dir).load_checkpoint()
    state["loop"]["envs"] = envs
    torch.save(to_plain(state), _latest(run_dir))


def test_a_forged_environment_snapshot_is_never_unpickled(run_copy, tmp_path):
    marker = tmp_path / "pwned"
    _with_snapshot(run_copy, {"data": pickle.dumps(_Runs(marker)), "hmac": "0" * 64})
    with pytest.warns(SnapshotNotice, match="not loaded"):
        run = rlherd.train(resume=run_copy, total_steps=STEPS + 100, progress=False)
    assert not marker.exists()
    assert run.summary["actor_steps"] >= STEPS + 100  # it went on, with fresh episodes


def test_a_snapshot_from_another_machine_resumes_with_fresh_episodes(run_copy, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "another-machine.key"))
    with pytest.warns(SnapshotNotice, match="not sealed by the key"):
        run = rlherd.train(resume=run_copy, total_steps=STEPS + 100, progress=False)
    assert run.summary["actor_steps"] >= STEPS + 100


class _Unloadable:
    """Pickles, and raises when unpickled, as an environment whose own ``__setstate__`` fails."""

    def __reduce__(self):
        return int, ("not a number",)


def test_a_snapshot_of_this_machine_that_does_not_load_resumes_with_fresh_episodes(run_copy):
    _with_snapshot(run_copy, seal(pickle.dumps(_Unloadable())))
    with pytest.warns(SnapshotNotice, match="does not load .ValueError"):
        run = rlherd.train(resume=run_copy, total_steps=STEPS + 100, progress=False)
    assert run.summary["actor_steps"] >= STEPS + 100


def test_a_snapshot_of_this_machine_resumes_mid_episode(run_copy, recwarn):
    rlherd.train(resume=run_copy, total_steps=STEPS + 100, progress=False)
    assert not [w for w in recwarn if issubclass(w.category, SnapshotNotice)]


_DAMAGE = {
    "empty": b"",
    "not JSON": b"{'agent': ",
    "not UTF-8": b"\xff\xfe\x00",
    "a list": b"[1, 2]",
    "a field of the wrong type": None,  # config.json's seed a string; summary.json: n/a
    "nested too deep": b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",  # RecursionError
    "an int of 100,000 digits": b'{"seed": ' + b"9" * 100_000 + b"}",  # ValueError
}


@pytest.mark.parametrize("name, damage", [
    *[("config.json", damage) for damage in _DAMAGE],
    *[("summary.json", damage) for damage in _DAMAGE if _DAMAGE[damage] is not None],
])  # fmt: skip
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_damaged_run_file_is_one_line_before_anything_runs(command, name, damage, run_copy,
                                                             capsys, monkeypatch):  # fmt: skip
    if _DAMAGE[damage] is None:
        meta = json.loads((run_copy / name).read_text())
        content = json.dumps({**meta, "seed": "one"}).encode()
    else:
        content = _DAMAGE[damage]
    (run_copy / name).write_bytes(content)
    _no_episodes(monkeypatch)
    args = ["eval", str(run_copy)] if command == "eval" else [
        "train", "--resume", str(run_copy), "--total-steps", str(2 * STEPS)]  # fmt: skip
    assert main(args) == 2
    line = _one_line(capsys)
    assert name in line and ("restore it" in line or "train the run again" in line), line


def _replace(path, make):
    path.unlink()
    make(path)


_NOT_REGULAR = {
    "a FIFO": os.mkfifo,  # blocked its reader for ever
    "a link to /dev/zero": lambda path: path.symlink_to("/dev/zero"),  # read until memory ran out
    "a directory": lambda path: path.mkdir(),
}


@pytest.mark.timeout(120)  # a FIFO blocked the command for ever
@pytest.mark.parametrize("kind", _NOT_REGULAR)
@pytest.mark.parametrize("name, command", [
    ("config.json", "eval"), ("config.json", "resume"), ("summary.json", "eval"),
    ("checkpoints/latest", "eval"), ("metrics/train.csv", "plot"),
    ("metrics/train.csv", "resume"), ("config.json", "config"),
])  # fmt: skip
def test_a_run_file_that_is_no_regular_file_is_one_line(name, command, kind, run_copy, tmp_path,
                                                        capsys, monkeypatch):  # fmt: skip
    _replace(run_copy / name, _NOT_REGULAR[kind])
    _no_episodes(monkeypatch)
    assert main(_command(command, run_copy, tmp_path)) == 2
    line = _one_line(capsys)
    # A run to train is refused a link out of itself before its metrics are read.
    why = ("not a regular file", "outside the run directory")
    assert f"{run_copy / name} " in line and any(w in line for w in why), line


def test_a_run_file_too_large_for_what_it_holds_is_one_line(run_copy, capsys, monkeypatch):
    """A JSON record is read whole, so one of gigabytes (sparse here) is refused unread."""
    with open(run_copy / "summary.json", "r+b") as f:
        f.truncate(2**40)
    _no_episodes(monkeypatch)
    assert main(["eval", str(run_copy)]) == 2
    line = _one_line(capsys)
    assert str(run_copy / "summary.json") in line and "more than the 4,194,304" in line, line


@pytest.mark.parametrize("content, says", [
    ([1, 2], "holds a list, not an rlherd checkpoint"),
    ({"learner": np.zeros(2)}, "holds pickled Python objects"),  # the format before plain data
])  # fmt: skip
def test_a_checkpoint_of_the_wrong_type_or_an_older_format_is_one_line(
    content, says, run_copy, capsys, monkeypatch
):
    torch.save(content, _latest(run_copy))
    _no_episodes(monkeypatch)
    assert main(["eval", str(run_copy)]) == 2
    line = _one_line(capsys)
    assert says in line and str(_latest(run_copy)) in line


def _edit_config(run_dir, change):
    record = json.loads((run_dir / "config.json").read_text())
    change(record)
    (run_dir / "config.json").write_text(json.dumps(record))


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_layers_too_large_for_memory_are_one_line(command, run_copy, tmp_path, capsys,
                                                  monkeypatch):  # fmt: skip
    """torch's allocator refused the torso's 16 TB with a traceback."""
    _edit_config(run_copy, lambda record: record["config"].update(hidden_sizes=[10**12]))
    _no_episodes(monkeypatch)
    assert main(_command(command, run_copy, tmp_path)) == 2
    assert "hidden_sizes [1000000000000]: the torso's layers need more memory" in _one_line(capsys)


def test_record_dataset_added_to_a_run_trained_without_it_is_one_line(run_copy, tmp_path, capsys,
                                                                      monkeypatch):  # fmt: skip
    """Its resume restored a recording the checkpoint does not hold: a TypeError."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    _edit_config(run_copy, lambda record: record["settings"].update(record_dataset="a/b-v0"))
    assert main(_command("resume", run_copy, tmp_path)) == 2
    line = _one_line(capsys)
    assert f"{_latest(run_copy)} holds no recorded episodes" in line, line


def _put(state, keys, value):
    """``state`` with ``value`` at the path of ``keys``."""
    inner = state
    for key in keys[:-1]:
        inner = inner[key]
    inner[keys[-1]] = value
    return state


def _empty_pickle(path):
    """A zip as torch writes one, whose pickle holds an empty dict."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", "3\n")


# Checkpoints that torch loads as plain data, but that do not fit the run: eval read the policy
# and resume restored the run with a KeyError, torch's "size mismatch for torso.net.0.weight"
# or numpy's "state must be for a PCG64 RNG" deep inside.
_MISFITS = {
    "an empty dict": lambda state: {},
    "an empty pickle": None,  # torch's zip, written by _empty_pickle
    "a counter that is a list": lambda state: _put(state, ["recorder", "counters",
                                                           "actor_steps"], [1]),  # fmt: skip
    "a tensor of another shape": lambda state: _put(state, ["learner", "net",
                                                            "torso.net.0.weight"],
                                                    torch.zeros(5, 5)),  # fmt: skip
    "a policy without its torso": lambda state: _put(state, ["learner", "net"], {}),
    "another generator's state": lambda state: _put(state, ["actor", "rng", "bit_generator"],
                                                    "MT19937"),  # fmt: skip
}
_ACTING = ["an empty dict", "an empty pickle", "a counter that is a list",
           "a tensor of another shape", "a policy without its torso"]  # what eval reads


@pytest.mark.parametrize("command, misfit", [
    *[(command, misfit) for command in ("eval", "package") for misfit in _ACTING],
    *[("resume", misfit) for misfit in _MISFITS],
])  # fmt: skip
def test_a_checkpoint_that_does_not_fit_the_run_is_one_line(command, misfit, run_copy, tmp_path,
                                                           capsys, monkeypatch):  # fmt: skip
    path = _latest(run_copy)
    if _MISFITS[misfit] is None:
        _empty_pickle(path)
    else:
        torch.save(to_plain(_MISFITS[misfit](RunDir(run_copy).load_checkpoint())), path)
    _no_episodes(monkeypatch)
    assert main(_command(command, run_copy, tmp_path)) == 2
    line = _one_line(capsys)
    assert f"{path} does not fit the run's config" in line or f"{path} lacks" in line, line


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 8000000000 bytes"),
    NodeDied("the replay node died, so the program was stopped"),
])  # fmt: skip
def test_running_out_of_memory_or_a_node_while_restoring_is_not_called_a_misfit(error, tmp_path):
    """CUDA's and the CPU allocator's out-of-memory errors, and a distributed run's node dying
    while it restores, are RuntimeErrors: each was worded as a checkpoint that does not fit the
    run's config, sending the user to restore files that were fine."""
    with pytest.raises(type(error)) as raised, fitting(tmp_path / "ckpt.pt"):
        raise error
    assert raised.value is error


def test_a_misfit_names_an_environment_whose_spaces_changed_as_a_cause(tmp_path):
    """An environment of one's own whose observation grew from 4 to 5 numbers since the run
    trained (its code edited, as a researcher's is) was sent to look for an edited config.json
    alone."""
    mismatch = RuntimeError("Error(s) in loading state_dict for PPONetwork:\n\tsize mismatch for "
                            "policy_torso.net.0.weight")  # fmt: skip
    changed = r"was config.json edited after training, or have the environment's spaces changed"
    with pytest.raises(ConfigError, match=changed), fitting(tmp_path / "ckpt.pt"):
        raise mismatch


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_network_sizes_edited_after_training_are_one_line(command, run_copy, tmp_path, capsys,
                                                          monkeypatch):  # fmt: skip
    record = json.loads((run_copy / "config.json").read_text())
    record["config"]["hidden_sizes"] = [64, 64]
    (run_copy / "config.json").write_text(json.dumps(record))
    _no_episodes(monkeypatch)
    assert main(_command(command, run_copy, tmp_path)) == 2
    line = _one_line(capsys)
    assert f"{_latest(run_copy)} does not fit the run's config" in line, line
    assert "size mismatch for torso.net.0.weight" in line and "config.json edited" in line


_HEADER = b"actor_steps,episode_return\n"
_DAMAGED_CSV = {  # each said AttributeError, ValueError, UnicodeDecodeError or _csv.Error
    "a row too long": _HEADER + b"1,2,3\n2,3\n",
    "a short row before the last": _HEADER + b"1\n2,3\n",
    "a value that is no number": _HEADER + b"abc,1\n",
    "a NUL byte": _HEADER + b"1,\x002\n",
    "bytes that are no text": b"\xb9\xff\xfe" * 100,
    "a field past the csv limit": _HEADER + b"1," + b"x" * 200_000 + b"\n",
}


@pytest.mark.parametrize("damage", _DAMAGED_CSV)
def test_damaged_metrics_are_one_line_in_plot(damage, run_copy, tmp_path, capsys):
    path = run_copy / "metrics" / "train.csv"
    path.write_bytes(_DAMAGED_CSV[damage])
    assert main(_command("plot", run_copy, tmp_path)) == 2
    line = _one_line(capsys)
    assert str(path) in line and "restore it from a copy of the run" in line, line


def test_the_short_last_row_of_a_run_killed_mid_write_is_left_out(run_copy, tmp_path):
    (run_copy / "metrics" / "train.csv").write_bytes(_HEADER + b"10,1.5\n20,2.5\n30")
    steps, curves = load_curves(run_copy)
    assert steps.tolist() == [10, 20] and curves[""].tolist() == [1.5, 2.5]
    assert main(_command("plot", run_copy, tmp_path)) == 0


def test_a_return_that_is_no_number_is_one_line_in_report(run_copy, capsys):
    path = run_copy / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "final_return_mean": "abc"}))
    assert main(["report", str(run_copy)]) == 2
    line = _one_line(capsys)
    assert f"{path}: final_return_mean is 'abc', not a number" in line, line


@pytest.fixture(scope="module")
def self_play(tmp_path_factory):
    """A small self-play run on Connect Four, with snapshots of its policy."""
    return rlherd.train("ppo", "pettingzoo/pettingzoo.classic.connect_four_v3", total_steps=1_200,
                        run_dir=tmp_path_factory.mktemp("self-play") / "run", progress=False,
                        opponent_every=500).path  # fmt: skip


def _reshaped(path):
    """Rewrite the snapshot at ``path`` with its first matrix 3x3."""
    policy = from_plain(torch.load(path, weights_only=True))
    name = next(k for k, v in policy.items() if v.dim() == 2)
    torch.save(to_plain({**policy, name: torch.zeros(3, 3)}), path)


_BAD_SNAPSHOTS = {  # each said a traceback: EOFError, UnpicklingError, IsADirectoryError, torch's
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:3000]),
    "pickled": lambda path: torch.save({"net": _Runs(path.with_name("pwned"))}, path),
    "a directory": lambda path: (path.unlink(), path.mkdir()),
    "of other shapes": _reshaped,
}


@pytest.mark.parametrize("bad", _BAD_SNAPSHOTS)
def test_a_bad_snapshot_is_one_line(bad, self_play, tmp_path, capsys):
    run = shutil.copytree(self_play, tmp_path / "run")
    step = RunDir(run).snapshots()[-1]
    path = run / "snapshots" / f"snapshot-{step:012d}.pt"
    _BAD_SNAPSHOTS[bad](path)
    assert main(["eval", str(run), "--episodes", "2", "--opponent", f"snapshot:{step}"]) == 2
    line = _one_line(capsys)
    assert str(path) in line and "train the run again" in line, line
    assert not path.with_name("pwned").exists()


def test_a_full_disk_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    real_save, saves = torch.save, []

    def save_until_full(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) > 1:  # as torch's zip writer fails on a full disk: no OSError
            with open(path, "wb") as f:
                f.write(b"half a checkpoint")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 "
                               "vs 534")  # fmt: skip
        real_save(obj, path, *args, **kwargs)

    def usage(path):  # the disk is full once the second checkpoint is written
        return SimpleNamespace(free=0 if len(saves) > 1 else 10**9)

    monkeypatch.setattr(rlherd.run.rundir.torch, "save", save_until_full)
    monkeypatch.setattr(shutil, "disk_usage", usage)
    run = tmp_path / "run"
    code = main(["train", "dqn", "--env", "CartPole-v1", "--total-steps", "2000", "--run-dir",
                 str(run), "--checkpoint-interval-s", "0", "--no-progress"])  # fmt: skip
    assert code == 2
    line = _one_line(capsys)
    assert "no space left to write" in line and "ckpt-" in line
    first = saves[0].name.lstrip(".").removesuffix(".tmp")
    assert (run / "checkpoints" / "latest").read_text() == first
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert RunDir(run).load_checkpoint()["recorder"]
    # The same failure with room on the disk is not the disk's: it keeps its traceback.
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: SimpleNamespace(free=10**9))  # fmt: skip
    with pytest.raises(RuntimeError, match="unexpected pos"):
        rlherd.run.rundir._torch_save({}, tmp_path / "x.pt")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_says_where_it_stopped_and_exits_130(signum, code, tmp_path, capsys, interrupt_at):
    interrupt_at(300, signum)
    run = tmp_path / "run"
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-steps", "5000", "--run-dir",
                 str(run), "--no-progress"]) == code  # fmt: skip
    err = capsys.readouterr().err
    steps = json.loads((run / "summary.json").read_text())["actor_steps"]
    assert f"interrupted at step {steps}; resume with `rlherd train --resume {run}`" in err


def test_resuming_a_finished_run_changes_nothing(run_copy, capsys):
    files = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(run_copy), "--no-progress"]) == 0
    assert "finished at" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()} == files


class _Explodes(gym.Wrapper):
    def step(self, action):
        raise RuntimeError("the simulator crashed")


@rlherd.env_factory
def exploding_cartpole() -> gym.Env:
    """CartPole whose first step raises (a factory, found by its module path)."""
    return _Explodes(gym.make("CartPole-v1"))


def test_a_crashed_start_does_not_block_its_run_dir(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulator crashed"):  # a bug keeps its traceback
        rlherd.train("dqn", "test_safe_files:exploding_cartpole", total_steps=500, run_dir=run,
                     progress=False)  # fmt: skip
    assert (run / "config.json").exists()
    with pytest.warns(UserWarning, match="stopped before its first checkpoint"):
        again = rlherd.train("dqn", "CartPole-v1", total_steps=500, run_dir=run, progress=False)
    assert again.summary["actor_steps"] >= 500


def test_a_run_in_use_is_not_replaced_or_resumed(run_copy, tmp_path):
    holder = RunDir(run_copy)
    holder.lock()
    try:
        with pytest.raises(ConfigError, match="in use by another rlherd process"):
            rlherd.train(resume=run_copy, total_steps=2 * STEPS, progress=False)
    finally:
        holder.unlock()


def test_a_run_still_training_toward_its_first_checkpoint_says_so(run_copy, capsys):
    """A run that another process is training and that has written no checkpoint yet (its
    first minute): eval, export and package said "the run stopped before its first one", which
    sent the user to look for a crash. They say it is still training now; once its process has
    gone, a run without a checkpoint did stop before its first one."""
    for path in (run_copy / "checkpoints").iterdir():
        path.unlink()
    holder = RunDir(run_copy)
    holder.lock()
    try:
        for argv in (["eval", str(run_copy)], ["export", str(run_copy)]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "still training" in err, err
    finally:
        holder.unlock()
    assert main(["eval", str(run_copy)]) == 2
    assert "the run stopped before its first one" in capsys.readouterr().err


def test_a_garbage_protobuf_gets_invalid_argument():
    server, address = serve("CartPole-v1", "127.0.0.1:0")
    channel = grpc.insecure_channel(address)
    try:
        call = channel.stream_stream(METHOD, request_serializer=lambda raw: raw,
                                     response_deserializer=pb.ServerMessage.FromString)  # fmt: skip
        requests: queue.Queue = queue.Queue()
        stream = call(iter(requests.get, None))
        requests.put(b"\xff\xff\xff\xff not a protobuf")
        with pytest.raises(grpc.RpcError) as error:
            next(stream)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed message" in error.value.details()
    finally:
        requests.put(None)
        channel.close()
        server.stop(0).wait(10)


@pytest.mark.parametrize("damaged", ["main_data.hdf5", "metadata.json"])
def test_a_damaged_dataset_is_one_line_and_leaves_no_run_dir(damaged, finished, tmp_path, capsys,
                                                             monkeypatch):  # fmt: skip
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    assert main(["collect", str(finished), "--out", "safe/cartpole-v0", "--episodes", "2",
                 "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    (tmp_path / "datasets" / "safe" / "cartpole-v0" / "data" / damaged).write_bytes(b"{garbage")
    run = tmp_path / "offline"
    code = main(["train", "cql", "--env", "CartPole-v1", "--dataset", "safe/cartpole-v0",
                 "--total-steps", "10", "--run-dir", str(run), "--no-progress"])  # fmt: skip
    assert code == 2
    assert "is damaged or not a Minari dataset" in _one_line(capsys)
    assert not run.exists()
