"""deploy/wheelhouse.py's parts that need no index: the platform tags it asks pip for, the requirements
it reads from pyproject.toml, and the stand-in torch wheel pip must accept as torch. The whole path,
wheelhouse to offline install, is tests/test_offline_install.py (`make test-offline`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "deploy" / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheelhouse)


def test_a_manylinux_platform_brings_every_older_one() -> None:
    tags = wheelhouse.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_29_x86_64" not in tags
    # grpcio ships manylinux2014 only, markupsafe manylinux_2_17, zope.interface manylinux1
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux2014_aarch64" in wheelhouse.platform_tags("manylinux_2_17_aarch64")
    assert "manylinux2014_x86_64" not in wheelhouse.platform_tags("manylinux_2_12_x86_64")
    assert wheelhouse.platform_tags("macosx_14_0_arm64") == ["macosx_14_0_arm64"]


def test_each_set_is_the_project_requirements_with_its_extras_expanded() -> None:
    check = wheelhouse.requirements(wheelhouse.SETS["check"])
    dev = wheelhouse.requirements(wheelhouse.SETS["dev"])
    names = {wheelhouse.normalize(r.split(">")[0].split("=")[0].split("[")[0]) for r in check}
    assert {"grpcio", "transformers", "flask", "gevent", "pytest", "pytest-xdist", "openai", "torch"} <= names
    assert not [r for r in check + dev if r.startswith("conduit")], "the project's own extras are expanded"
    assert set(check) < set(dev) and any(r.startswith("playwright") for r in dev)
    assert not any(r.startswith("playwright") for r in check), "the fast tier imports no playwright"


def test_the_stand_in_is_a_torch_pip_installs(tmp_path: Path) -> None:
    wheelhouse.stand_in_torch(tmp_path)
    (wheel,) = tmp_path.glob("*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    (metadata,) = target.glob("torch-*.dist-info/METADATA")
    assert f"Name: torch\nVersion: {wheelhouse.HOST_TORCH}" in metadata.read_text()
    assert not (target / "torch").exists(), "metadata only: nothing to import"
