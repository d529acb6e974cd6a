"""The inference-gateway overlay (deploy/kubernetes/inference-gateway/): engine and shim in one pod
behind an InferencePool whose endpoint picker reads Conduit's metric names.

Its core kinds are validated as the rest of deploy/ is (kubernetes-validate, strict). The Gateway
API's kinds (InferencePool, HTTPRoute) are custom resources that tool has no schema for: they are
checked against the fields of their v1 CRDs that the overlay uses (unknown fields fail), and against
what must hold together: the pool selects the server pods, targets the shim's port and names the
picker's Service; the picker may watch the pool; the route sends to the pool.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from test_deploy_files import (ANYONE, ENGINE_PORT, KUBERNETES_VERSION, SHIM_PORT, admitted,
                               check_engine_requires_the_token, check_shim_sends_the_token, check_store_is_writable,
                               entrypoint_args, flag, peer_admits, peer_is, run, tool)

pytestmark = pytest.mark.slow  # deploy linters, like test_deploy_files.py

OVERLAY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "inference-gateway"
CUSTOM_KINDS = {"InferencePool", "HTTPRoute"}
ENGINE_METRICS_PORT = 9090

_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
_METADATA = {"type": "object", "required": ["name"],
             "properties": {"name": _NAME, "namespace": _NAME, "labels": {"type": "object"},
                            "annotations": {"type": "object"}}, "additionalProperties": False}
# The v1 CRDs' fields the overlay uses (inference.networking.k8s.io/v1, gateway.networking.k8s.io/v1).
SCHEMAS: dict[str, dict[str, Any]] = {
    "InferencePool": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "inference.networking.k8s.io/v1"}, "kind": {"const": "InferencePool"},
            "metadata": _METADATA,
            "spec": {
                "type": "object", "required": ["selector", "targetPorts", "endpointPickerRef"],
                "additionalProperties": False,
                "properties": {
                    "selector": {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
                                 "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                                "additionalProperties": {"type": "string"}}}},
                    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                                    "items": {"type": "object", "required": ["number"],
                                              "properties": {"number": _PORT}, "additionalProperties": False}},
                    "endpointPickerRef": {
                        "type": "object", "required": ["name", "port"], "additionalProperties": False,
                        "properties": {"name": _NAME, "group": {"type": "string"}, "kind": {"const": "Service"},
                                       "failureMode": {"enum": ["FailOpen", "FailClose"]},
                                       "port": {"type": "object", "required": ["number"],
                                                "properties": {"number": _PORT}, "additionalProperties": False}}},
                },
            },
        },
    },
    "HTTPRoute": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "gateway.networking.k8s.io/v1"}, "kind": {"const": "HTTPRoute"},
            "metadata": _METADATA,
            "spec": {
                "type": "object", "required": ["parentRefs", "rules"], "additionalProperties": False,
                "properties": {
                    "parentRefs": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["name"], "additionalProperties": False,
                        "properties": {"name": _NAME, "namespace": _NAME, "sectionName": {"type": "string"}}}},
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "matches": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                        "properties": {"path": {"type": "object", "additionalProperties": False,
                                                                "properties": {"type": {"enum": [
                                                                    "Exact", "PathPrefix", "RegularExpression"]},
                                                                    "value": {"type": "string"}}}}}},
                            "backendRefs": {"type": "array", "minItems": 1, "items": {
                                "type": "object", "required": ["name"], "additionalProperties": False,
                                "properties": {"group": {"type": "string"}, "kind": {"type": "string"},
                                               "name": _NAME, "port": _PORT, "weight": {"type": "integer"}}}},
                        }}},
                },
            },
        },
    },
}


def files() -> list[Path]:
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    return [(OVERLAY / name).resolve() for name in kustomization["resources"]]


def resources() -> list[dict[str, Any]]:
    return [d for path in files() for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [r for r in resources() if r["kind"] == kind and name in (None, r["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def test_the_kustomization_lists_every_file_of_the_overlay() -> None:
    listed = {path for path in files() if path.parent == OVERLAY}
    assert listed == {p for p in OVERLAY.glob("*.yaml") if p.name != "kustomization.yaml"}


def test_core_kinds_validate(tmp_path: Path) -> None:
    core = [r for r in resources() if r["kind"] not in CUSTOM_KINDS]
    assert {r["kind"] for r in core} >= {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    result = run(tool("kubernetes-validate"), "-k", KUBERNETES_VERSION, "--strict", "--quiet", str(manifest))
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_custom_kinds_match_their_crds() -> None:
    custom = [r for r in resources() if r["kind"] in CUSTOM_KINDS]
    assert {r["kind"] for r in custom} == CUSTOM_KINDS
    for r in custom:
        jsonschema.validate(r, SCHEMAS[r["kind"]])
    with pytest.raises(jsonschema.ValidationError):  # the schemas do reject what the CRDs would
        jsonschema.validate({**one("InferencePool"), "spec": {**one("InferencePool")["spec"], "targetPortNumber": 8000}},
                            SCHEMAS["InferencePool"])


def test_the_pool_selects_the_server_pods_on_the_shims_port_and_names_the_picker() -> None:
    pool, server = one("InferencePool"), one("Deployment", "conduit-server")
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels.get("llm-d.ai/engine-type") == "conduit"
    (port,) = pool["spec"]["targetPorts"]
    shim = containers(server)["shim"]
    assert port["number"] == SHIM_PORT in {p["containerPort"] for p in shim["ports"]}
    picker = one("Service", pool["spec"]["endpointPickerRef"]["name"])
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] in {p["port"] for p in picker["spec"]["ports"]}
    route = one("HTTPRoute")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])


def test_each_pod_is_one_model_server_engine_and_shim_beside_it() -> None:
    server = one("Deployment", "conduit-server")
    pod = containers(server)
    assert set(pod) == {"engine", "shim"}
    shim_args = entrypoint_args("shim.Dockerfile", pod["shim"]["args"])
    engine_args = entrypoint_args("engine.Dockerfile", pod["engine"]["args"])
    assert flag(shim_args, "--engine") == f"127.0.0.1:{flag(engine_args, '--port')}"  # its own engine only
    assert flag(shim_args, "--port") == str(SHIM_PORT)
    assert flag(engine_args, "--metrics-port") == str(ENGINE_METRICS_PORT)
    assert flag(engine_args, "--metrics-host") == "0.0.0.0"  # the picker scrapes it from its own pod
    grace = server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    for args in (shim_args, engine_args):
        assert grace > float(flag(args, "--drain-seconds", "30")) + 5
    assert pod["shim"]["readinessProbe"]["httpGet"]["path"] == "/health"
    assert int(pod["engine"]["resources"]["limits"]["nvidia.com/gpu"]) == 1


def test_the_picker_scrapes_the_engines_metrics_under_conduits_names() -> None:
    picker = one("Deployment", "conduit-epp")
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    given = dict(re.fullmatch(r"(--[\w-]+)=(.*)", arg).groups() for arg in container["args"])
    assert given["--pool-name"] == one("InferencePool")["metadata"]["name"]
    assert int(given["--model-server-metrics-port"]) == ENGINE_METRICS_PORT
    assert given["--total-queued-requests-metric"] == "conduit:num_requests_waiting"
    assert given["--total-running-requests-metric"] == "conduit:num_requests_running"
    assert given["--kv-cache-usage-percentage-metric"] == "conduit:kv_cache_usage_perc"
    assert given["--cache-info-metric"] == "conduit:cache_config_info"
    role = one("Role", picker["spec"]["template"]["spec"]["serviceAccountName"])
    resources_allowed = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"inferencepools", "pods"} <= resources_allowed


def pod_labels(name: str) -> dict[str, str]:
    return one("Deployment", name)["spec"]["template"]["metadata"]["labels"]


def test_the_engine_is_closed_to_every_other_pod_and_the_gateway_reaches_the_shim() -> None:
    policies = [r for r in resources() if r["kind"] == "NetworkPolicy"]
    server = pod_labels("conduit-server")
    grpc = admitted(policies, server, ENGINE_PORT, "grpc")
    assert grpc is not None, "no NetworkPolicy selects the server pods: every pod in the cluster reaches the engine"
    # The pod's own shim calls its engine over loopback, which no policy filters; no other pod needs to.
    assert all(peer_is(peer, server) for peer in grpc), grpc
    # The gateway's proxy (in a namespace of its own) sends to the shim; the picker scrapes the engine.
    assert ANYONE in admitted(policies, server, SHIM_PORT, "http")
    epp = pod_labels("conduit-epp")
    assert any(peer_admits(peer, epp) for peer in admitted(policies, server, ENGINE_METRICS_PORT, "metrics"))


def test_the_engine_requires_a_token_its_shim_sends_and_the_store_is_writable() -> None:
    server = one("Deployment", "conduit-server")
    pod = server["spec"]["template"]["spec"]
    check_engine_requires_the_token(pod, containers(server)["engine"])
    check_shim_sends_the_token(containers(server)["shim"])
    assert containers(server)["shim"]["securityContext"]["readOnlyRootFilesystem"]
    check_store_is_writable(pod, containers(server)["shim"])
