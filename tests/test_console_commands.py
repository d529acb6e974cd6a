"""conduit-engine, conduit-shim and conduit-stack: every flag has an environment variable, the
variables really set the values, and the commands work after a real (non-editable) `pip install .`.

The installed check builds and installs the package into a fresh venv without downloading anything:
the venv is made without pip, and a .pth file lends it the project venv's site-packages (pip,
setuptools and every dependency). That path comes after the fresh venv's own site-packages, where
our package lands, and the .pth files inside it (the project's editable install) are not run, so
the commands import the installed copy; the test checks that they do.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from launcher import stack as launch
from engine_service import __main__ as engine_main
from fake_engine import MODEL_ID, first_line, stop_process
from http_shim import options as shim_options

REPO_ROOT = Path(__file__).resolve().parent.parent
PARSERS = {
    "conduit-engine": engine_main.build_parser,
    "conduit-shim": shim_options.build_parser,
    "conduit-stack": launch.build_parser,
}


def options_of(parser):
    return [action for action in parser._actions if action.option_strings and action.dest != "help"]


def parse(command: str, argv: list[str], monkeypatch, **env: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return PARSERS[command]().parse_args(argv)


# ------------------------------------------------------------------ every flag names its variable


@pytest.mark.parametrize("command", PARSERS)
def test_every_flag_names_its_environment_variable_in_help(command):
    parser = PARSERS[command]()
    help_text = parser.format_help()
    seen: dict[str, str] = {}
    for action in options_of(parser):
        names = getattr(action, "env_names", ())
        assert names, f"{command} {action.option_strings[0]} has no environment variable"
        for name in names:
            assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), name
            assert f"env {name}" in action.help or f" or {name}" in action.help, (action.option_strings, action.help)
            assert name in help_text
            assert seen.setdefault(name, action.dest) == action.dest, f"{name} is read by two flags"


def test_help_shows_defaults_but_never_a_variables_value(monkeypatch):
    monkeypatch.setenv("CONDUIT_ENGINE_TOKEN", "s3cret-token")
    monkeypatch.setenv("CONDUIT_PORT", "9999")
    help_text = " ".join(shim_options.build_parser().format_help().split())  # undo the wrapping
    assert "s3cret-token" not in help_text and "9999" not in help_text
    assert "(env CONDUIT_PORT; default 8000)" in help_text
    assert "(env CONDUIT_ENGINE, comma-separated)" in help_text
    assert "(env CONDUIT_API_KEYS or CONDUIT_API_KEY, comma-separated, added to the flags)" in help_text


# ------------------------------------------------------------------ variables set the values


def test_typed_variables_set_the_values(monkeypatch):
    shim = parse("conduit-shim", [], monkeypatch, CONDUIT_MAX_N="3", CONDUIT_HEARTBEAT_S="0.5",
                 CONDUIT_LOG_FORMAT="json", CONDUIT_ENGINE=" a:1, b:2 ,", CONDUIT_HOST="")  # empty: unset
    assert (shim.max_n, shim.heartbeat_interval, shim.log_format, shim.engine, shim.host) == (
        3, 0.5, "json", ["a:1", "b:2"], "127.0.0.1")
    engine = parse("conduit-engine", [], monkeypatch, CONDUIT_DETERMINISTIC="yes",
                   CONDUIT_ENABLE_PREFIX_CACHING="Off", CONDUIT_QUANTIZATION="int8", CONDUIT_KV_CACHE_GB="0.25",
                   CONDUIT_CHAT_TEMPLATE="t.jinja")
    assert (engine.deterministic, engine.enable_prefix_caching, engine.quantization, engine.kv_cache_gb) == (
        True, False, "int8", 0.25)
    assert engine.chat_template == Path("t.jinja")  # the flag's own type
    stack = parse("conduit-stack", [], monkeypatch, MODEL="my-model", ENGINE_PORT="6000", REPLICAS="2")
    assert (stack.model, stack.engine_port, stack.replicas, stack.shim_port) == ("my-model", 6000, 2, 8000)


def test_flags_win_over_variables(monkeypatch):
    monkeypatch.setenv("CONDUIT_MAX_N", "3")
    monkeypatch.setenv("CONDUIT_ENGINE", "a:1,b:2")
    shim = parse("conduit-shim", ["--max-n", "16", "--engine", "c:3"], monkeypatch)
    assert (shim.max_n, shim.engine) == (16, ["c:3"])  # a repeatable flag replaces the variable's list
    engine = parse("conduit-engine", ["--enable-prefix-caching"], monkeypatch, CONDUIT_ENABLE_PREFIX_CACHING="0")
    assert engine.enable_prefix_caching is True


def test_credentials_from_variables_add_to_the_flags(monkeypatch):
    shim = parse("conduit-shim", ["--api-key", "k0"], monkeypatch, CONDUIT_API_KEYS="k1, k2", CONDUIT_API_KEY="k3")
    assert shim.api_key == ["k1", "k2", "k3", "k0"]
    engine = parse("conduit-engine", ["--auth-token", "t0"], monkeypatch, CONDUIT_ENGINE_TOKENS="t1,t2")
    assert engine.auth_token == ["t1", "t2", "t0"]


@pytest.mark.parametrize(("command", "name", "value", "message"), [
    ("conduit-shim", "CONDUIT_MAX_N", "many", "invalid int value: 'many'"),
    ("conduit-shim", "CONDUIT_HEARTBEAT_S", "soon", "invalid float value: 'soon'"),
    ("conduit-shim", "CONDUIT_LOG_FORMAT", "xml", "invalid choice: 'xml' (choose from text, json)"),
    ("conduit-engine", "CONDUIT_DETERMINISTIC", "maybe", "expected one of 1/true/yes/on/0/false/no/off, got 'maybe'"),
    ("conduit-engine", "CONDUIT_QUANTIZATION", "int3", "invalid choice: 'int3'"),
    ("conduit-stack", "ENGINE_PORT", "http", "invalid int value: 'http'"),
])
def test_a_bad_value_is_a_usage_error_naming_the_variable(command, name, value, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(command, [], monkeypatch, **{name: value})
    assert exit_info.value.code == 2
    assert f"error: environment variable {name}: {message}" in capsys.readouterr().err


def test_the_engines_command_line_answers_before_torch_loads():
    """--help and a bad flag answer at once: parsing imports neither torch nor transformers."""
    code = ("import sys; from engine_service import __main__ as m; m.parse_args(['--max-batch-size', '4']); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ------------------------------------------------------------------ after `pip install .`


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the package installed from a copy of the working tree; returns its bin/."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"  # a copy: the build writes build/ and *.egg-info next to pyproject.toml
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], REPO_ROOT)
    for name in filter(None, listed.split("\0")):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).strip())
    lent = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "project-venv.pth").write_text("".join(f"{path}\n" for path in lent))
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
          "--ignore-installed", str(source)], root)
    return venv / "bin"


def _clean_env() -> dict[str, str]:
    """This environment without what could point Python back at the repo."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@pytest.mark.slow  # a fresh venv with the package installed
def test_installed_package_is_a_copy_with_its_data(installed, tmp_path):
    site = _run([str(installed / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                tmp_path).strip()
    where = _run([str(installed / "python"), "-c",
                  "import clients, conduit.v1.engine_pb2 as pb, engine_service, http_shim\n"
                  "for m in (clients, pb, engine_service, http_shim): print(m.__file__)"], tmp_path, _clean_env())
    assert all(line.startswith(site) for line in where.splitlines()), where
    playground = REPO_ROOT / "http_shim" / "playground"
    if playground.is_dir():
        wanted = sorted(p.name for p in playground.iterdir() if p.is_file())
        assert wanted and sorted(p.name for p in (Path(site) / "http_shim" / "playground").iterdir()) == wanted


@pytest.mark.slow
@pytest.mark.parametrize("command", PARSERS)
def test_installed_command_help_lists_every_flag_and_variable(installed, tmp_path, command):
    out = _run([str(installed / command), "--help"], tmp_path, _clean_env())  # cwd outside the repo
    assert out.startswith(f"usage: {command} ")
    for action in options_of(PARSERS[command]()):
        assert all(flag in out for flag in action.option_strings), action.option_strings
        assert all(name in out for name in action.env_names), action.env_names


@pytest.mark.slow
def test_installed_shim_serves_configured_by_its_environment(installed, tmp_path, fake):
    env = {**_clean_env(), "CONDUIT_ENGINE": fake.address, "CONDUIT_HOST": "127.0.0.1", "CONDUIT_PORT": "0",
           "CONDUIT_API_KEYS": "installed-key"}
    process = subprocess.Popen([str(installed / "conduit-shim")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               text=True)
    try:
        line = first_line(process, 60)
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+) \(engine (\S+)\)", line)
        assert match and match.group(2) == fake.address, line
        models = f"{match.group(1)}/v1/models"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(models, timeout=10)
        assert refused.value.code == 401  # CONDUIT_API_KEYS reached the installed shim
        request = urllib.request.Request(models, headers={"Authorization": "Bearer installed-key"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert MODEL_ID in response.read().decode()
    finally:
        stop_process(process)


@pytest.mark.slow
def test_installed_stack_exits_1_when_its_port_is_taken(installed, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        # make run-stack's variables; engine port 0: a free one, so only the shim's is taken
        env = {**_clean_env(), "SHIM_PORT": str(taken.getsockname()[1]), "ENGINE_PORT": "0"}
        done = subprocess.run([str(installed / "conduit-stack")], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 1, done  # main()'s return value is the exit status
    assert f"127.0.0.1:{env['SHIM_PORT']} is already in use" in done.stderr


def test_serving_installs_no_system_package_and_the_tests_bring_their_browser() -> None:
    """`make run-stack` on a machine without chromium must not reach for apt (a user who only
    serves gets no system package prompt); `make test` installs the browser its tests need."""
    def recipe(target: str) -> str:
        return subprocess.run(["make", "-n", "-B", target], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout

    assert "apt-get" not in recipe("run-stack") and "chromium" not in recipe("run-stack")
    assert "apt-get install -y -q chromium" in recipe("test")


def test_requires_python_admits_no_version_the_code_cannot_run_on() -> None:
    """pip installs on any Python that requires-python admits: 3.10 has no asyncio.timeout (GenerateMany
    uses it), so it must be refused there rather than fail at the first call."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert not spec.contains("3.10.14"), spec
    assert spec.contains(f"{sys.version_info.major}.{sys.version_info.minor}.0"), spec
