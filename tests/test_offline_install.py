"""The air-gapped install (docs/operations-offline.md) on this CPU machine, as a GPU host without a
package index would see it: a copy of the working tree (tracked and new files, as a clone would
have them) and a wheelhouse, and a "host" python3 that imports torch: the CPU build standing in for
a CUDA one, installed with what a PyTorch image has beside it (numpy) into a user site-packages
(PYTHONUSERBASE), which a venv with system site packages sees and a plain one does not.

The wheelhouse (`make wheelhouse`) and the host's torch are built once into the cache with the index
reachable; everything after runs through tests/airgap.py: no index, every proxy at a tripwire that
counts connections, and (as root) a network namespace with loopback only. `make install OFFLINE=1
HOST_TORCH=1` keeps the host's torch and installs the rest from the wheelhouse, the fast tier passes
in that venv, and `make gpu-check` writes its environment report and says no GPU is present. The
tripwire counts no connection at any step.

`make test-offline` runs it (a few minutes: a fresh install and the whole fast tier); `make test`
skips it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_service.model.cache_dir import cache_dir

ROOT = Path(__file__).resolve().parent.parent
AIRGAP = ROOT / "tests" / "airgap.py"
RUN_ENV = "CONDUIT_TEST_OFFLINE"
# The host's interpreter (this venv's base), whose user site-packages holds the host's torch.
HOST_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
HOST_TORCH = "torch==2.13.0"  # the CPU build on this machine's disk (DESIGN.md)
# What tests/fake or model-less runs must not inherit from this process: another tree's imports.
DROPPED_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.environ.get(RUN_ENV) != "1",
                       reason=f"a fresh offline install: `make test-offline` ({RUN_ENV}=1)"),
]


def network_namespace() -> list[str]:
    """`unshare --net` with loopback up, where this process may make one (root); else nothing."""
    wrapper = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "airgap"]
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return []
    return wrapper if subprocess.run([*wrapper, "true"], capture_output=True).returncode == 0 else []


def airgapped(command: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float) -> tuple[int, str]:
    """`command`'s status and output, run without a network; fails the test if it reached for one."""
    counter = log.with_suffix(".connections")
    with log.open("w") as out:
        code = subprocess.run([*network_namespace(), sys.executable, str(AIRGAP), str(counter), "--", *command],
                              cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    output = log.read_text()
    assert counter.read_text() == "0", f"{command} reached for the network:\n{output[-3000:]}"
    return code, output


def wheelhouse_key() -> str:
    """What the wheelhouse is built from: the project's requirements, the script and the Python version."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for path in (ROOT / "pyproject.toml", ROOT / "deploy" / "wheelhouse.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def built_once(target: Path, build) -> Path:
    """`target`, built by `build(folder)` into a fresh folder and renamed (a run cut short leaves no half)."""
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        build(partial)
        partial.rename(target)
    return target


@pytest.fixture(scope="module")
def online_parts() -> tuple[Path, Path]:
    """(the wheelhouse, the host's user base), from the cache or built now with the index reachable."""
    cache = cache_dir() / "offline-test"
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"

    def wheelhouse(folder: Path) -> None:
        subprocess.run(["make", "--no-print-directory", "wheelhouse", f"WHEELHOUSE={folder}", f"PY={HOST_PYTHON}"],
                       cwd=ROOT, check=True, timeout=600)

    def host(folder: Path) -> None:
        subprocess.run([str(HOST_PYTHON), "-m", "pip", "install", "-q", "--user", "--no-warn-script-location",
                        HOST_TORCH, "numpy"], env={**os.environ, "PYTHONUSERBASE": str(folder)},
                       check=True, timeout=900)

    return (built_once(cache / f"wheelhouse-{wheelhouse_key()}", wheelhouse),
            built_once(cache / f"host-{python}-{HOST_TORCH.replace('==', '-')}", host))


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree's tracked and new files, nothing ignored (no venv, no caches)."""
    dest = tmp_path_factory.mktemp("offline") / "conduit"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def host_env(online_parts: tuple[Path, Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV and not k.startswith("PYTEST_")}
    return {**env, "PYTHONUSERBASE": str(online_parts[1])}


@pytest.fixture(scope="module")
def make_offline(online_parts: tuple[Path, Path]) -> list[str]:
    return ["make", "--no-print-directory", "OFFLINE=1", f"WHEELHOUSE={online_parts[0]}", "HOST_TORCH=1",
            f"PY={HOST_PYTHON}"]


@pytest.fixture(scope="module")
def installed(clone: Path, host_env: dict[str, str], make_offline: list[str]) -> Path:
    """The clone after `make install` offline; its venv's python."""
    code, output = airgapped([*make_offline, "install"], clone, host_env, clone.parent / "install.log", 900)
    assert code == 0, output[-5000:]
    return clone / ".venv" / "bin" / "python"


def where(python: Path, module: str, env: dict[str, str]) -> Path:
    out = subprocess.run([str(python), "-c", f"import {module}; print({module}.__file__)"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def test_the_host_has_torch_and_a_plain_venv_does_not(online_parts, host_env, tmp_path) -> None:
    """The stand-in is a fair one: the host's python3 imports torch, a venv without system site packages cannot."""
    assert where(HOST_PYTHON, "torch", host_env).is_relative_to(online_parts[1])
    subprocess.run([str(HOST_PYTHON), "-m", "venv", "--without-pip", str(tmp_path / "plain")], check=True)
    plain = subprocess.run([str(tmp_path / "plain" / "bin" / "python"), "-c", "import torch"], env=host_env,
                           capture_output=True, text=True)
    assert plain.returncode != 0 and "No module named 'torch'" in plain.stderr


def test_offline_install_keeps_the_host_torch_and_takes_the_rest_from_the_wheelhouse(
        installed, clone, online_parts, host_env) -> None:
    wheelhouse, host = online_parts
    assert not list(wheelhouse.glob("torch-*")), "the wheelhouse carries no torch"
    assert where(installed, "torch", host_env).is_relative_to(host), "the host's torch was replaced"
    assert where(installed, "transformers", host_env).is_relative_to(clone / ".venv")
    assert "make install: torch 2.13.0" in (clone.parent / "install.log").read_text()
    # The wheelhouse's versions, even where the host's python has an older one in range (pytest, flask).
    pins = [line for line in (wheelhouse / "constraints.txt").read_text().splitlines() if "==" in line]
    check = ("import importlib.metadata as m, sys\n"
             "for name, version in (p.split('==') for p in sys.argv[1:]):\n"
             "    if m.version(name) != version: print(name, m.version(name), 'not', version)")
    mismatched = subprocess.run([str(installed), "-c", check, *pins], env=host_env, capture_output=True,
                                text=True, check=True).stdout
    assert len(pins) > 50 and not mismatched, mismatched


def test_fast_tier_passes_in_the_offline_venv(installed, clone, host_env) -> None:
    code, output = airgapped([str(installed), "-m", "pytest", "-m", "not model", "-q", "-p", "no:cacheprovider"],
                             clone, host_env, clone.parent / "fast-tier.log", 900)
    assert code == 0 and " passed" in output.splitlines()[-1], output[-5000:]


def test_gpu_check_reports_no_gpu_without_the_network(installed, clone, host_env, make_offline) -> None:
    out = clone.parent / "gpu-check"
    code, output = airgapped([*make_offline, "gpu-check", f"GPU_OUT={out}"], clone, host_env,
                             clone.parent / "gpu-check.log", 300)
    assert code != 0, output
    assert "gpu-check: FAILED: no CUDA GPU here, nothing was checked" in output, output
    assert "pip install" not in output, "the installed venv was installed again"
    report = (out / "env.txt").read_text()
    assert "torch 2.13.0" in report and "cuda: no GPU visible to torch" in report, report
    assert (out / "summary.txt").read_text().startswith("gpu-check: FAILED: no CUDA GPU")
