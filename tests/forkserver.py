"""Shim and engine processes for the tests, forked from one that has imported the program already.

The tests start ~50 shims and ~20 engines. A `python -m http_shim` spends ~1.2 s of CPU importing
gevent, grpc and Flask before it listens; a `python -m engine_service` ~4 s importing torch and
transformers (of a ~7 s start). So a test process starts one server per program, which imports what
the program imports (for the shim, gevent's patching first, as there), and forks a process per
request: each child runs the program's own `main()` with the request's arguments, environment,
working folder and output files, and is a real process on its own socket, signalled and reaped as
`python -m PROGRAM` would be. Nothing the program runs at start is skipped: the fork happens before
`main()`, and nothing the fork could break exists before it: no grpc channel or server (grpc's core
starts at the first one), no thread, and no torch op (OpenMP's thread pool starts at the first).

Protocol, over a Unix socket: the client sends one JSON line {"argv", "env", "cwd"} with its
stdout and stderr file descriptors (SCM_RIGHTS); the server answers "pid N\\n", and the child, as it
exits, "exit CODE\\n" on the same connection; a child killed by a signal just closes it.

The fake engine (tests/fake_engine.py) is served the same way, for the tests that signal it as a process
of its own: a fresh `python tests/fake_engine.py` took ~0.6 s to import grpc and the engine's server.

Usage: python tests/forkserver.py http_shim|engine_service|fake_engine SOCKET_PATH
"""

import importlib
import sys

# First: the program's entry module, which for the shim patches the standard library for gevent and
# readies grpc for it, as `python -m http_shim` does, before anything else imports socket or threading.
PROGRAM = sys.argv[1]
program_main = importlib.import_module(PROGRAM if PROGRAM == "fake_engine" else f"{PROGRAM}.__main__")
# What the engine's main() imports once its flags are parsed: torch, transformers and the engine; and
# the shim's, at its first engine channel (~0.07 s a shim, and the tests start ~50).
PRELOAD = {"engine_service": ["torch", "transformers.models.llama.modeling_llama", "conduit_common.memory",
                              "engine_service.core.engine", "engine_service.core.faults",
                              "engine_service.core.metrics", "engine_service.model.loader",
                              "engine_service.serving.background", "engine_service.serving.server"],
           "http_shim": ["grpc._channel"]}
for module in PRELOAD.get(PROGRAM, []):
    importlib.import_module(module)

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402

from conduit_common.lifetime import ENV_VAR, die_with_parent  # noqa: E402


def _run_child(request: dict, conn: socket.socket) -> None:
    """In the forked child: become `python -m PROGRAM ARGV`, report how it ended on `conn`, exit."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the program reaps its own children
        os.setsid()  # as the launcher's processes: a terminal's Ctrl-C reaches the tests, not this child
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[ENV_VAR] = str(os.getppid())  # die with this server, which dies with the test process
        os.chdir(request["cwd"])
        sys.argv = [PROGRAM, *request["argv"]]
        die_with_parent()
        program_main.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(conn.fileno(), f"exit {code}\n".encode())
        os._exit(code)


def _reap(*_: object) -> None:
    """The children's exit statuses, which their connections already reported (no zombies left)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def main() -> None:
    die_with_parent()
    if PROGRAM != "http_shim":  # gevent's fork (the shim's) reaps on its own
        signal.signal(signal.SIGCHLD, _reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[2])
    listener.listen(64)
    print("ready", flush=True)
    while True:  # one request at a time: a child starts with nothing else running
        conn, _ = listener.accept()
        message, (out_fd, err_fd), _, _ = socket.recv_fds(conn, 1 << 20, 2)
        pid = os.fork()
        if pid == 0:
            listener.close()
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            os.close(out_fd)
            os.close(err_fd)
            _run_child(json.loads(message), conn)
        os.close(out_fd)
        os.close(err_fd)
        conn.sendall(f"pid {pid}\n".encode())
        conn.close()  # the child holds its own copy, on which it reports its exit


if __name__ == "__main__":
    main()
