"""Shim processes for the tests, forked from one that has imported the shim already.

The shim tests start ~50 shims (each module its own, with its own flags; drain and fault tests one
per test). A `python -m http_shim` spends ~1.2 s of CPU importing gevent, grpc and Flask before it
listens: most of the fast tier's CPU. So a test process starts this server once, which imports
what `python -m http_shim` imports (gevent's patching first, as there), and forks a shim per
request: each child runs the shim's own `main()` with the request's arguments, environment,
working folder and output files, and is a real process on its own socket, signalled and reaped
as `python -m http_shim` would be. Nothing the shim runs at start is skipped: the fork happens
before `main()`, and no engine channel exists before it (grpc's core starts at the first one).

Protocol, over a Unix socket: the client sends one JSON line {"argv", "env", "cwd"} with its
stdout and stderr file descriptors (SCM_RIGHTS); the server answers "pid N\\n", and the child, as it
exits, "exit CODE\\n" on the same connection; a child killed by a signal just closes it.
"""

# First: it patches the standard library for gevent and readies grpc for it, as `python -m
# http_shim` does, before anything else imports socket, threading or grpc.
import http_shim.__main__ as shim_main

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

from conduit.common.lifetime import ENV_VAR, die_with_parent  # noqa: E402


def _run_child(request: dict, conn: socket.socket) -> None:
    """In the forked child: become `python -m http_shim ARGV`, report how it ended on `conn`, exit."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[ENV_VAR] = str(os.getppid())  # die with this server, which dies with the test process
        os.chdir(request["cwd"])
        sys.argv = ["http_shim", *request["argv"]]
        die_with_parent()
        shim_main.main()
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


def main() -> None:
    die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    print("ready", flush=True)
    while True:  # one request at a time, in the main greenlet: a child starts with nothing else running
        conn, _ = listener.accept()
        message, (out_fd, err_fd), _, _ = socket.recv_fds(conn, 1 << 20, 2)
        pid = os.fork()  # gevent's: the child's event loop starts afresh, and this one reaps it
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
