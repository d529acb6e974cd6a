"""The engine's tokens and the shim's API keys follow one set of rules (conduit_common.bearer): the same
tests, run against both. A real engine or shim given a file without a secret, a file it cannot read,
a secret holding whitespace or an empty one refuses to start (a usage error naming the file) rather
than run open; both sides accept and refuse the same authorization values, comparing in constant time."""

from __future__ import annotations

import hmac
import subprocess
import sys
from pathlib import Path

import pytest

import forked
from launcher.stack import REPO_ROOT
from conduit_common import bearer
from conduit_common.lifetime import child_env
from engine_service.serving.security import TokenAuthInterceptor

# Each side: its secret flag, its file flag, and how it checks an authorization value.
SIDES = {
    "engine": ("--auth-token", "--auth-token-file",
               lambda secrets: lambda value: TokenAuthInterceptor(secrets).authorized([("authorization", value)])),
    "shim": ("--api-key", "--api-key-file", lambda secrets: bearer.BearerSecrets(secrets).authorizes),
}


def refused(side: str, argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of the real program started with `argv` (port 0: a start would not collide).
    The engine's checks come before torch loads (~0.6 s a run); the shim is forked from a process that
    has imported it (tests/forked.py), as its other tests start it."""
    argv = [*argv, "--port", "0"]
    if side == "engine":
        done = subprocess.run([sys.executable, "-m", "engine_service", *argv], cwd=REPO_ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stderr
    process = forked.start("http_shim", ["--engine", "127.0.0.1:1", *argv], child_env(), REPO_ROOT,
                           stderr=subprocess.PIPE)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the shim started instead of refusing") from None
    return code, process.stderr.read()


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("content, problem", [
    ("", "holds no"),
    ("# the team's tokens\n\n   \n# old-secret\n", "holds no"),
    ("good-secret\ntwo words\n", "line 2 holds whitespace"),
])
def test_a_secret_file_that_would_leave_it_open_stops_it_at_start(side, content, problem, tmp_path: Path):
    path = tmp_path / "secrets.txt"
    path.write_text(content)
    code, stderr = refused(side, [SIDES[side][1], str(path)])
    assert code == 2 and str(path) in stderr and problem in stderr, stderr


@pytest.mark.parametrize("side", SIDES)
def test_a_missing_file_or_an_empty_secret_stops_it_at_start(side, tmp_path: Path):
    missing = tmp_path / "nowhere.txt"
    code, stderr = refused(side, [SIDES[side][1], str(missing)])
    assert code == 2 and "cannot read the" in stderr and str(missing) in stderr, stderr
    code, stderr = refused(side, [SIDES[side][0], ""])
    assert code == 2 and "is empty" in stderr, stderr


@pytest.mark.parametrize("side", SIDES)
def test_both_sides_accept_and_refuse_the_same_values(side):
    check = SIDES[side][2](["alpha", "beta"])
    for value in ("Bearer alpha", "bearer beta", "  Bearer   alpha  "):
        assert check(value), value
    for value in ("Bearer alph", "Bearer alphaa", "alpha", "Basic alpha", "Bearer", "Bearer ", "",
                  "Bearer alpha beta", "Bearer gamma"):
        assert not check(value), value


@pytest.mark.parametrize("side", SIDES)
def test_every_secret_is_compared_in_constant_time(side, monkeypatch):
    calls = []
    compare = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(bearer.hmac, "compare_digest", counting)
    check = SIDES[side][2](["alpha", "beta", "gamma"])
    for value, accepted in [("Bearer alpha", True), ("Bearer gamma", True), ("Bearer nope", False), ("", False)]:
        calls.clear()
        assert check(value) is accepted
        # Every secret is compared whatever matched, and always as equal-length digests.
        assert len(calls) == 3 and {len(a) for a, _ in calls} == {32}
