"""The smg-gateway overlay (deploy/kubernetes/smg-gateway/): the Shepherd gateway in front of the base's
engine pods as gRPC workers, found by Kubernetes service discovery.

Validated as the rest of deploy/ is (kubernetes-validate, strict: every kind here is core), and for
what must hold together: the gateway's selector names the engine pods' label, its discovery port is
the engines' gRPC port, it watches their namespace, its service account may list and watch pods
there, and its Service and probes use the port it listens on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from test_deploy_files import ENGINE_PORT, KUBERNETES_VERSION, flag, run, tool

pytestmark = pytest.mark.slow  # deploy linters, like test_deploy_files.py

OVERLAY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "smg-gateway"


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())


def files() -> list[Path]:
    return [(OVERLAY / name).resolve() for name in kustomization()["resources"]]


def resources() -> list[dict[str, Any]]:
    return [d for path in files() for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def gateway_args() -> list[str]:
    (container,) = one("Deployment", "conduit-smg")["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_the_kustomization_lists_every_file_of_the_overlay_and_the_base_engines() -> None:
    listed = set(files())
    assert {p for p in listed if p.parent == OVERLAY} == {p for p in OVERLAY.glob("*.yaml")
                                                          if p.name != "kustomization.yaml"}
    assert {p.name for p in listed if p.parent == OVERLAY.parent} == \
        {"namespace.yaml", "engine-deployment.yaml", "engine-service.yaml"}


def test_every_resource_validates(tmp_path: Path) -> None:
    manifest = tmp_path / "overlay.yaml"
    manifest.write_text(yaml.safe_dump_all(resources()))
    result = run(tool("kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", "--quiet", str(manifest))
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_the_gateway_discovers_the_engine_pods_on_their_grpc_port() -> None:
    args, engine = gateway_args(), one("Deployment", "conduit-engine")
    assert args[0] == "launch" and "--service-discovery" in args and flag(args, "--policy") == "cache_aware"
    key, _, value = flag(args, "--selector").partition("=")
    assert engine["spec"]["template"]["metadata"]["labels"].get(key) == value
    assert int(flag(args, "--service-discovery-port")) == ENGINE_PORT
    (engine_container,) = engine["spec"]["template"]["spec"]["containers"]
    assert ENGINE_PORT in [p["containerPort"] for p in engine_container["ports"]]
    assert flag(args, "--service-discovery-namespace") == kustomization()["namespace"]
    assert flag(args, "--host") == "0.0.0.0", "the Service reaches it on the pod's address"


def test_its_service_account_may_watch_pods_and_its_port_is_served() -> None:
    deployment = one("Deployment", "conduit-smg")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one("RoleBinding", "conduit-smg-discovery")
    assert {"kind": "ServiceAccount", "name": account, "namespace": "conduit"} in binding["subjects"]
    role = one("Role", binding["roleRef"]["name"])
    assert any("pods" in rule["resources"] and {"get", "list", "watch"} <= set(rule["verbs"]) for rule in role["rules"])

    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(flag(gateway_args(), "--port"))
    assert ports["metrics"] == int(flag(gateway_args(), "--prometheus-port"))
    service = one("Service", "conduit-smg")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
