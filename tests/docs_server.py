"""A fork server for the ``rlherd`` stand-in of test_docs: the documentation runs about a hundred
commands, and each fresh Python process spent 4-5 s of a core importing torch, rlherd's train and
eval commands and ``torch._dynamo`` (on the first optimizer step) before doing a tiny budget's
work in well under one. This process imports them once; each command is a fork of it.

``python docs_server.py SOCKET`` serves; the stand-in (:data:`CLIENT`) sends its arguments,
working directory, environment and standard streams, and exits with the command's exit status.
A forked command runs as the ``rlherd`` script would: ``rlherd.cli.main`` on the arguments (cut
to tiny budgets by ``test_docs.tiny_budget``), with the client's directory, environment (its
``PYTHONPATH`` too) and streams, an exception printed with its traceback and exit status 1,
and exit handlers run. What a fork cannot take from the client: variables read when the
interpreter or an already imported library starts (``PYTHONHASHSEED``, ``OMP_NUM_THREADS``),
and signals, which reach the client alone (no documented command is interrupted). Linux only
(``SOCK_SEQPACKET``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable

# The stand-in: a Python without site-packages starts in ~20 ms (a fork of the server then runs
# the command). The server's socket path is filled in by the test's fixture.
CLIENT = """#!{python} -S
import json, os, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
    s.connect({path!r})
    request = dict(args=sys.argv[1:], cwd=os.getcwd(), env=dict(os.environ))
    socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
    status = s.recv(1)
if not status:
    sys.exit("rlherd stand-in: the command's process died without an exit status")
sys.exit(status[0])
"""

MAX_REQUEST = 1 << 20  # bytes: the arguments and the environment


def serve(path: str) -> None:
    """Accept commands on the Unix socket at ``path`` until killed, each in a fork."""
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlherd
    import torch._dynamo  # noqa: F401 - what the first optimizer step imports
    from test_docs import tiny_budget

    import rlherd.commands.evaluate  # noqa: F401 - imported by the commands, not at startup
    import rlherd.commands.train  # noqa: F401
    from rlherd.cli import main

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the commands
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(path + ".new")
        server.listen()
        os.rename(path + ".new", path)  # there once it listens: the fixture waits for it
        while True:
            conn, _ = server.accept()
            message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            if os.fork() == 0:
                status = 1
                try:
                    server.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    status = _command(json.loads(message), fds, lambda a: main(tiny_budget(a)))
                except BaseException:  # noqa: BLE001 - before the command: into the server's log
                    traceback.print_exc()
                finally:
                    with contextlib.suppress(OSError):  # a client gone: nobody to tell
                        conn.sendall(bytes([status]))
                    os._exit(status)
            conn.close()
            for fd in fds:
                os.close(fd)


def _command(request: dict, fds: list[int], run: Callable[[list[str]], int | None]) -> int:
    """In the fork: become the client's command and run it; its exit status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    server_path = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    given = os.environ.get("PYTHONPATH", "")
    if given != server_path:  # as a new interpreter would read it (PYTHONPATH=. rlherd ...)
        sys.path[1:1] = [os.path.abspath(p) for p in given.split(os.pathsep) if p]
    sys.argv = ["rlherd", *request["args"]]
    status = 1
    try:
        status = run(request["args"]) or 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, status 1
        traceback.print_exc()
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError):  # a closed pipe: as the interpreter, say nothing
        sys.stdout.flush()
        sys.stderr.flush()
    return status & 0xFF


if __name__ == "__main__":  # each of mono's actor processes imports this script
    serve(sys.argv[1])
