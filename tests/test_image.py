"""The server image (``make image``), run as ``deploy/k8s/base``'s Deployment runs it.

``make image-test`` runs these (marker ``image``; ``make test`` leaves them out). Each
container's ``docker run`` is derived from the manifest rendered by ``kubectl kustomize``, not
retyped: the container's command and args, uid/gid (runAsUser/runAsGroup, fsGroup added), a
read-only root file system (readOnlyRootFilesystem) with the ``emptyDir`` volumes as tmpfs, the
``secret`` volumes as read-only bind mounts of files the test writes (with the volume's
``defaultMode``, group fsGroup), capabilities dropped, no-new-privileges
(allowPrivilegeEscalation: false), the memory limit and the CPU limit (capped at this machine's
CPUs: Docker refuses more), the env, and ``--stop-timeout`` = terminationGracePeriodSeconds.
Every containerPort (and each ``--workers`` worker's metrics port, ``--metrics-port`` + i, which
the manifest does not declare) is published on 127.0.0.1 only (a free port Docker picks):
traffic goes to loopback addresses only. The image is the one built (``RP_IMAGE``), not the
manifest's registry reference. Docker has no preStop hook; the Deployment's ``sleep 5`` is not run.

Checks: the image's HEALTHCHECK (its own interval, timeout and start period) turns healthy and
grpc.health.v1 answers SERVING; ``remote-partitioner list`` from the host lists the built-in
partitioners and versions equal to the host's, and the image's packages equal the host's
``make venv`` pins; XNNPACK, Vulkan and Core ML lowerings through ``RemotePartitioner`` equal
local ones (Core ML after the conformance normalization), and so does a ``.pt2`` lowered with
the ``Lower`` RPC (the CLI's ``lower``); the processes run as 10001 and nothing is written
outside /tmp; ``docker stop`` during a lowering: it completes and the container exits 0 within
the grace period; three containers behind one multi-address target, one killed during a batch:
every lowering byte-identical; the TLS overlay's container serves TLS to a client with the CA;
the environments overlay's three containers (the default server, the Arm environment's server
of ``make image-arm`` and the front door of ``make image-router``) on one Docker network serve
every environment through the front door, Arm lowerings equal to local ones in ``.venv-arm``.

Without Docker (or without the image) the tests skip, saying why; with ``CI=true`` they fail.
Every container carries the label :data:`LABEL` with this session's id and is removed at the
end of its test or module, and whatever is left at the end of the session, even on failure.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from certs import _ca, _cert_pem, _leaf  # (tests/ is on sys.path)
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from executorch.exir import to_edge_transform_and_lower
from flows import run_flow
from grpc_health.v1 import health_pb2, health_pb2_grpc
from models import small_models

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.errors import RemotePartitionerError
from remote_partitioner.client.lower import LowerClient, partitioner_ref

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from build_image import runtime_closure

from conformance import normalize_coreml, normalize_openvino

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("RP_IMAGE", "remote-partitioner:0.1.0")
KUBECTL = Path(sys.executable).parent / "kubectl"
LABEL = "remote-partitioner.image-test"
SESSION = uuid.uuid4().hex[:12]
#: How long a container may take from `docker run` to SERVING (imports: ~10-20 s).
STARTUP_S = 240
LOWER_TIMEOUT_S = 600
#: The TLS overlay's probes check the certificate under this name.
TLS_NAME = "remote-partitioner"
BUILT_IN = {"xnnpack", "coreml", "vulkan"}


# ------------------------------------------------------------------------------ Docker


def _docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed (Debian: apt-get install docker.io)"
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer `docker info` in 60 s"
    if done.returncode != 0:
        return f"the Docker daemon cannot be reached: {done.stderr.strip()[-300:]}"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True,
                      timeout=60, check=False).returncode != 0:
        return f"the image {IMAGE} is not built (run `make image`)"
    return None


@pytest.fixture(scope="session", autouse=True)
def docker_ready() -> Iterator[None]:
    """Skip (fail with CI=true) without a usable Docker and image; at the end of the session,
    remove every container this session labelled, whatever happened."""
    problem = _docker_problem()
    if problem is not None:
        message = f"image tests need Docker and the image: {problem}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield
    finally:
        left = _docker("ps", "-aq", "--filter", f"label={LABEL}={SESSION}").split()
        if left:
            _docker("rm", "-f", *left, check=False)


# ---------------------------------------------------------------------------- manifests


def rendered(kustomization: str) -> list[dict[str, Any]]:
    """The objects of ``kubectl kustomize <kustomization>``."""
    out = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / kustomization)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def rendered_deployment(kustomization: str) -> dict[str, Any]:
    """The Deployment of ``kubectl kustomize <kustomization>`` (which renders one only)."""
    (deployment,) = [d for d in rendered(kustomization) if d["kind"] == "Deployment"]
    return deployment


_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``6Gi``, ``512M``, ``1073741824``) in bytes."""
    match = re.fullmatch(r"(\d+)([KMGT]i?|k)?", str(quantity))
    assert match, quantity
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def quantity_cpus(quantity: str) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


@dataclass
class Container:
    """A running container of the image: its id and the host addresses of its ports."""

    id: str
    ports: dict[int, str]  # containerPort -> "127.0.0.1:hostport"
    token: str
    token_file: Path

    @property
    def target(self) -> str:
        return self.ports[50051]

    def logs(self) -> str:
        """Its output, stdout and stderr in the order Docker passes them on."""
        done = subprocess.run(["docker", "logs", self.id], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60, check=False)
        return done.stdout

    def inspect(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(_docker("inspect", self.id))[0]
        return info


def docker_run_args(
    deployment: dict[str, Any], secret_dirs: dict[str, Path], image: str = IMAGE,
    network: tuple[str, str] | None = None,
) -> list[str]:
    """``docker run`` arguments (after ``run``) that run the Deployment's only container of
    ``image`` as the pod spec says; ``secret_dirs``: for each Secret or ConfigMap the pod
    mounts, a folder holding its keys; ``network``: (a Docker network, the container's alias
    on it: the name of the Service that selects its pods)."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pod_sc, sc = pod.get("securityContext", {}), container.get("securityContext", {})
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    assert uid is not None and gid is not None, "the manifest names no uid/gid"
    args = ["-d", "--label", f"{LABEL}={SESSION}", "--user", f"{uid}:{gid}"]
    if network is not None:
        args += ["--network", network[0], "--network-alias", network[1]]
    fs_group = pod_sc.get("fsGroup")
    if fs_group is not None:
        args += ["--group-add", str(fs_group)]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    for cap in sc.get("capabilities", {}).get("add", []):
        args += ["--cap-add", cap]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    assert not sc.get("privileged"), "the manifest asks for a privileged container"
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        args += ["--memory", str(quantity_bytes(limits["memory"]))]
    if "cpu" in limits:
        args += ["--cpus", f"{min(quantity_cpus(limits['cpu']), float(os.cpu_count() or 1)):g}"]
    for env in container.get("env", []):
        args += ["-e", f"{env['name']}={env['value']}"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit")
            opts = "rw,mode=1777" + (f",size={quantity_bytes(size)}" if size else "")
            args += ["--tmpfs", f"{mount['mountPath']}:{opts}"]
        elif "secret" in volume:
            folder = secret_dirs[volume["secret"]["secretName"]]
            mode = volume["secret"].get("defaultMode", 0o644)
            os.chmod(folder, 0o750)
            for path in [folder, *folder.iterdir()]:
                os.chown(path, 0, fs_group if fs_group is not None else gid)
            for path in folder.iterdir():
                os.chmod(path, mode)
            ro = ":ro" if mount.get("readOnly") else ""
            args += ["-v", f"{folder}:{mount['mountPath']}{ro}"]
        elif "configMap" in volume:
            folder = secret_dirs[volume["configMap"]["name"]]
            for path in [folder, *folder.iterdir()]:
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
            args += ["-v", f"{folder}:{mount['mountPath']}:ro"]
        else:
            raise AssertionError(f"volume kind not run by these tests: {volume}")
    ports = [port["containerPort"] for port in container.get("ports", [])]
    # `serve --workers N --metrics-port P`: worker i serves its metrics on P + i (the manifest
    # declares P only); published too, so that the tests see every worker's calls.
    flags = dict(a.split("=", 1) for a in container.get("args", []) if "=" in a)
    if "--metrics-port" in flags:
        first = int(flags["--metrics-port"])
        ports += [first + i for i in range(int(flags.get("--workers", "1")))
                  if first + i not in ports]
    for port in ports:
        args += ["-p", f"127.0.0.1::{port}"]
    probe = container.get("readinessProbe", {})
    if "exec" in probe:  # the TLS overlay: its probe replaces the image's plaintext one
        args += ["--health-cmd", shlex.join(probe["exec"]["command"])]
    if "terminationGracePeriodSeconds" in pod:
        args += ["--stop-timeout", str(pod["terminationGracePeriodSeconds"])]
    command = container.get("command")
    if not command:  # the image's entrypoint, with the container's args
        return [*args, image, *container.get("args", [])]
    return [*args, "--entrypoint", command[0], image, *command[1:], *container.get("args", [])]


def health_status(target: str, credentials: grpc.ChannelCredentials | None = None,
                  options: tuple[tuple[str, Any], ...] = ()) -> int | None:
    channel = (grpc.secure_channel(target, credentials, options=options) if credentials
               else grpc.insecure_channel(target, options=options))
    with channel:
        try:
            return int(health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3).status)
        except grpc.RpcError:
            return None


def wait_serving(container: Container, credentials: grpc.ChannelCredentials | None = None,
                 options: tuple[tuple[str, Any], ...] = ()) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if health_status(container.target, credentials, options) == \
                health_pb2.HealthCheckResponse.SERVING:
            return
        state = container.inspect()["State"]
        if not state["Running"]:
            raise AssertionError(f"container exited {state['ExitCode']}:\n{container.logs()}")
        time.sleep(0.5)
    raise AssertionError(f"not SERVING within {STARTUP_S} s:\n{container.logs()[-4000:]}")


@contextlib.contextmanager
def run_container(
    tmp: Path, kustomization: str = "deploy/k8s/base", tls: dict[str, bytes] | None = None,
    token: str | None = None,
) -> Iterator[Container]:
    """A container of the image run as ``kustomization``'s Deployment says (``token``: the
    token Secret's one token, a fresh one by default; ``tls``: the TLS Secret's keys);
    removed on exit."""
    tmp.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_urlsafe(24)
    token_dir = tmp / "token"
    token_dir.mkdir()
    (token_dir / "tokens").write_text(token + "\n")
    token_file = tmp / "client-token"
    token_file.write_text(token + "\n")
    secret_dirs = {"remote-partitioner-token": token_dir}
    if tls is not None:
        tls_dir = tmp / "tls"
        tls_dir.mkdir()
        for name, data in tls.items():
            (tls_dir / name).write_bytes(data)
        secret_dirs["remote-partitioner-tls"] = tls_dir
    args = docker_run_args(rendered_deployment(kustomization), secret_dirs)
    cid = _docker("run", *args).strip()
    try:
        yield Container(cid, _published(cid), token, token_file)
    finally:
        _docker("rm", "-f", cid, check=False)


def _published(cid: str) -> dict[int, str]:
    """The container's published ports: containerPort -> "127.0.0.1:hostport"."""
    ports = {}
    for line in _docker("port", cid).splitlines():  # "50051/tcp -> 127.0.0.1:49153"
        inner, _, outer = line.partition(" -> ")
        ports[int(inner.split("/")[0])] = outer.strip()
    assert all(p.startswith("127.0.0.1:") for p in ports.values()), ports
    return ports


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """One container of the base Deployment, SERVING, shared by the module's checks."""
    with run_container(tmp_path_factory.mktemp("container")) as container:
        wait_serving(container)
        yield container


# ------------------------------------------------------------------------------ models


def _export(name: str) -> torch.export.ExportedProgram:
    module, inputs = small_models()[name]
    return torch.export.export(module.eval(), inputs, strict=True)


def _local_partitioner(backend: str) -> Any:
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        return XnnpackPartitioner()
    if backend == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        return VulkanPartitioner()
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    return CoreMLPartitioner()


def _lower(ep: torch.export.ExportedProgram, partitioner: Any) -> bytes:
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    delegated = any("executorch_call_delegate" in str(n.target)
                    for n in edge.exported_program().graph.nodes)
    assert delegated, "nothing was delegated: the comparison would prove little"
    return bytes(edge.to_executorch().buffer)


_LOCAL: dict[tuple[str, str], bytes] = {}


def local_pte(model: str, backend: str) -> bytes:
    if (model, backend) not in _LOCAL:
        _LOCAL[model, backend] = _lower(_export(model), _local_partitioner(backend))
    return _LOCAL[model, backend]


def remote_pte(target: str, model: str, backend: str, token: str, **kwargs: Any) -> bytes:
    remote = RemotePartitioner(target, backend, token=token, timeout=LOWER_TIMEOUT_S,
                               remote_preprocess=True, **kwargs)
    pte = _lower(_export(model), remote)
    assert remote.stats["preprocess_calls"] >= 1, remote.stats  # the container preprocessed
    return pte


class _Deep(torch.nn.Module):
    """Deep enough that its lowering takes seconds (about 7 s here, locally), well inside the
    grace period even in a container sharing 2 cores (stop during a lowering)."""

    def __init__(self, layers: int = 16, width: int = 256) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return torch.cumsum(x, dim=1)


def _archive(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    buffer = io.BytesIO()
    torch.export.save(torch.export.export(module.eval(), inputs, strict=True), buffer)
    return buffer.getvalue()


def _local_archive_pte(archive: bytes) -> bytes:
    ep = torch.export.load(io.BytesIO(archive))  # trusted: this test wrote it
    return _lower(ep, _local_partitioner("xnnpack"))


# ------------------------------------------------------------------------------ checks


def test_runs_as_the_manifest_says(served: Container) -> None:
    """uid/gid 10001 for every process, read-only root, no capabilities, no new privileges,
    the memory limit; nothing written outside /tmp."""
    (spec,) = rendered_deployment("deploy/k8s/base")["spec"]["template"]["spec"]["containers"]
    host = served.inspect()["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == quantity_bytes(spec["resources"]["limits"]["memory"])
    assert set(host["Tmpfs"]) == {"/tmp"}
    assert served.inspect()["Config"]["User"] == "10001:10001"
    # Every process (the server and its --workers=2 worker processes), by /proc on the host.
    rows = [line.split() for line in _docker("top", served.id, "-eo", "uid,gid,pid").splitlines()]
    ids = {(r[0], r[1]) for r in rows[1:]}
    assert len(rows) - 1 >= 3, rows
    assert ids == {("10001", "10001")}, rows
    # Nothing in the container's writable layer but the mount points Docker made for the
    # secrets (and their parents); the tmpfs /tmp is not part of it ...
    mounts = [Path(m["Destination"]) for m in served.inspect()["Mounts"]]
    made = {str(p) for m in mounts for p in [m, *m.parents] if str(p) != "/"}
    changed = [line.split(maxsplit=1) for line in _docker("diff", served.id).splitlines()]
    assert [c for c in changed if c[1] not in made] == [], changed
    # ... and the root file system refuses a write, as the server's uid.
    tried = subprocess.run(
        ["docker", "exec", served.id, "python", "-c", "open('/opt/venv/x', 'w')"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert tried.returncode != 0 and "Read-only file system" in tried.stderr, tried.stderr


def test_healthcheck_and_grpc_health(served: Container) -> None:
    """The image's own HEALTHCHECK (its interval and start period, not shortened) turns
    healthy, and grpc.health.v1 answers SERVING from the host."""
    check = served.inspect()["Config"]["Healthcheck"]
    assert "remote_partitioner.server.probe" in " ".join(check["Test"])
    bound = (check["StartPeriod"] + check["Interval"] * (check["Retries"] + 2)) / 1e9
    deadline = time.monotonic() + bound
    status = None
    while time.monotonic() < deadline:
        status = served.inspect()["State"]["Health"]["Status"]
        if status == "healthy":
            break
        time.sleep(1)
    assert status == "healthy", served.inspect()["State"]["Health"]
    assert health_status(served.target) == health_pb2.HealthCheckResponse.SERVING


def _cli(*args: str, timeout: float = LOWER_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_cli_list_shows_the_partitioners_and_the_hosts_versions(served: Container) -> None:
    done = _cli("list", "--target", served.target, "--token-file", str(served.token_file),
                "--json", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = json.loads(done.stdout)
    assert {p["name"] for p in listed["partitioners"]} >= BUILT_IN
    versions = listed["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["executorch"] == metadata.version("executorch")
    assert versions["server"] == metadata.version("remote-partitioner")
    # The image sets no PYTHONHASHSEED: serve, its entry point, restarted itself with seed 0.
    assert versions["python_hash_seed"] == "0"


def test_image_packages_are_the_hosts_pins() -> None:
    """Every package in the image's virtualenv at the version `make venv` installed here."""
    frozen = _docker("run", "--rm", "--network", "none", "--label", f"{LABEL}={SESSION}",
                     "--entrypoint", "pip", IMAGE, "list", "--format", "json")
    image = {p["name"].lower().replace("_", "-").replace(".", "-"): p["version"]
             for p in json.loads(frozen)}
    image.pop("pip")
    assert image.pop("remote-partitioner") == metadata.version("remote-partitioner")
    host = {key: version for key, (_, version) in runtime_closure().items()}
    assert image == host


@pytest.mark.parametrize(("backend", "model"), [
    ("xnnpack", "mlp"), ("xnnpack", "conv"), ("vulkan", "conv"), ("coreml", "conv"),
])
def test_lowering_through_the_container_is_local_lowering(
    served: Container, backend: str, model: str,
) -> None:
    """Partitioned and preprocessed in the container, the .pte is the local one (Core ML:
    equal after the conformance normalization across processes, and the same length)."""
    remote = remote_pte(served.target, model, backend, served.token)
    local = local_pte(model, backend)
    if backend == "coreml":
        assert len(remote) == len(local)
        assert normalize_coreml(remote, across_processes=True) == normalize_coreml(
            local, across_processes=True)
    else:
        assert remote == local, f"remote {len(remote)} B, local {len(local)} B"


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.fc2(torch.relu(self.fc1(x))), dim=1)


def test_cli_lower_of_a_pt2(served: Container, tmp_path: Path) -> None:
    """The `Lower` RPC (the CLI's `lower`) on a .pt2: the local .pte."""
    archive = _archive(_Net(), (torch.randn(2, 8),))
    model, out = tmp_path / "model.pt2", tmp_path / "model.pte"
    model.write_bytes(archive)
    done = _cli("lower", str(model), "-o", str(out), "--partitioner", "xnnpack",
                "--target", served.target, "--token-file", str(served.token_file))
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes() == _local_archive_pte(archive)


def test_docker_stop_during_a_lowering(tmp_path: Path) -> None:
    """SIGTERM (`docker stop`, which waits --stop-timeout = terminationGracePeriodSeconds)
    while a Lower call runs: the call completes with the local .pte, and the container exits
    0 within the grace period."""
    archive = _archive(_Deep(), (torch.randn(2, 256),))
    grace = rendered_deployment("deploy/k8s/base")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    with run_container(tmp_path / "c") as container:
        wait_serving(container)
        # The workers' one-time costs (imports, first lowering) first: the grace covers calls,
        # the measured call is a warm one.
        small = _archive(_Net(), (torch.randn(2, 8),))
        with LowerClient(container.target, token=container.token,
                         timeout=LOWER_TIMEOUT_S) as client:
            for _ in range(2):
                client.lower(small, [partitioner_ref("xnnpack")])
        result: dict[str, Any] = {}

        def lower() -> None:
            try:
                with LowerClient(container.target, token=container.token,
                                 timeout=LOWER_TIMEOUT_S) as client:
                    result["pte"] = client.lower(archive, [partitioner_ref("xnnpack")]).pte
            except BaseException as e:  # reported below
                result["error"] = e

        uploads = container.logs().count("rpc=UploadBlobs")
        thread = threading.Thread(target=lower)
        thread.start()
        # Its upload logged: the Lower call follows at once and runs for seconds.
        deadline = time.monotonic() + LOWER_TIMEOUT_S
        while container.logs().count("rpc=UploadBlobs") == uploads:
            assert thread.is_alive() and time.monotonic() < deadline, (
                f"the archive's upload was never logged: {result.get('error')!r}")
            time.sleep(0.05)
        started = time.monotonic()
        _docker("stop", container.id, timeout=grace + 60)
        stopped = time.monotonic() - started
        thread.join(timeout=LOWER_TIMEOUT_S)
        state = container.inspect()["State"]
        logs = container.logs()
    assert "error" not in result, f"{result['error']!r}\n{logs[-3000:]}"
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, logs[-3000:])
    assert stopped < grace, f"stopped after {stopped:.1f} s (grace {grace} s)"
    # The call was in flight when SIGTERM came: answered after the shutdown began.
    lowered = [m.start() for m in re.finditer(r"rpc=Lower .*code=OK", logs)]
    assert lowered and 0 <= logs.find("shutting down") < lowered[-1], logs[-3000:]
    assert result["pte"] == _local_archive_pte(archive)


#: ExecuTorch's lowering is not thread-safe (as in tests/test_failover.py): a client thread
#: holds this lock while it lowers, except while it waits for the server, so that the threads'
#: calls overlap on the containers.
_LOCAL_WORK = threading.Lock()
HOOK_RPCS = ("Partition", "OpsToNotDecompose", "TransformForPreDecomposition")


class _Client(RemotePartitioner):
    """A ``RemotePartitioner`` that lets other client threads work during its RPCs."""

    def _rpc(self, method: Any, request: Any, **kwargs: Any) -> Any:
        _LOCAL_WORK.release()
        try:
            return super()._rpc(method, request, **kwargs)
        finally:
            _LOCAL_WORK.acquire()


def _hook_calls(container: Container, metric: str) -> float:
    """``metric`` summed over the container's hook calls and every worker's metrics port:
    ``remote_partitioner_in_flight`` (running) or ``remote_partitioner_requests_total``."""
    total = 0.0
    for port in (p for p in container.ports if p != 50051):
        url = f"http://{container.ports[port]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        total += sum(float(v) for rpc, v in re.findall(
            rf'^{metric}\{{[^}}]*rpc="(\w+)"[^}}]*\}} (\S+)$', text, re.M)
            if rpc in HOOK_RPCS)
    return total


def test_failover_across_three_containers(tmp_path: Path) -> None:
    """Three containers (one token Secret) behind one ``ipv4:`` multi-address target (the
    client's default channel config: ring_hash affinity, retries of UNAVAILABLE); three client
    threads lower eight small models; once one lowering finished, the first container seen
    running a hook call (else the one that served the most) is killed (SIGKILL, `docker kill`)
    while lowerings not yet started remain: every lowering still gives the local .pte."""
    names = ["linear", "mlp", "conv", "add-mul"] * 2
    want = {m: local_pte(m, "xnnpack") for m in set(names)}
    todo = [(m, _export(m)) for m in names]  # exported here: export is not thread-safe
    token = secrets.token_urlsafe(24)
    done: list[tuple[str, bytes]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with contextlib.ExitStack() as stack:
        containers = [stack.enter_context(run_container(tmp_path / f"c{i}", token=token))
                      for i in range(3)]
        for container in containers:
            wait_serving(container)
        target = "ipv4:" + ",".join(c.target for c in containers)

        def worker() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    model, ep = todo.pop()
                try:
                    with _LOCAL_WORK:
                        pte = _lower(ep, _Client(target, "xnnpack", token=token,
                                                 timeout=LOWER_TIMEOUT_S))
                except BaseException as e:  # reported below
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    done.append((model, pte))

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + LOWER_TIMEOUT_S
        while not done:
            assert not errors, errors
            assert time.monotonic() < deadline, "no lowering finished"
            time.sleep(0.01)
        # The first container seen running a hook call (for up to 2 s), else the busiest.
        victim, patient_until = None, time.monotonic() + 2.0
        while victim is None and time.monotonic() < patient_until:
            running = [c for c in containers
                       if _hook_calls(c, "remote_partitioner_in_flight") >= 1]
            victim = running[0] if running else None
        if victim is None:
            victim = max(containers,
                         key=lambda c: _hook_calls(c, "remote_partitioner_requests_total"))
        with lock:
            not_started = len(todo)
        _docker("kill", victim.id)
        # Lowerings not yet started make all their calls after the kill.
        assert not_started >= 1, "the batch was nearly over before the kill"
        for thread in threads:
            thread.join(timeout=LOWER_TIMEOUT_S)
    assert not errors, errors
    assert sorted(m for m, _ in done) == sorted(names)
    for model, pte in done:
        assert pte == want[model], model


def _tls_files() -> tuple[dict[str, bytes], bytes]:
    """The TLS Secret's keys (tls.crt naming TLS_NAME and 127.0.0.1, tls.key, ca.crt) and
    the CA."""
    ca = _ca("remote-partitioner image-test CA")
    cert, key = _leaf(TLS_NAME, ca, ExtendedKeyUsageOID.SERVER_AUTH,
                      [x509.DNSName(TLS_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    ca_pem = _cert_pem(ca[0])
    return {"tls.crt": cert, "tls.key": key, "ca.crt": ca_pem}, ca_pem


def test_tls_overlay(tmp_path: Path) -> None:
    """The TLS overlay's Deployment: its certificate mounts and args; it serves TLS (a
    plaintext client gets no answer), its exec probe (the image's health check replaced by
    it) turns healthy, and a client with the CA lowers the local .pte through it."""
    files, ca = _tls_files()
    with run_container(tmp_path / "c", "deploy/k8s/overlays/tls", tls=files) as container:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        wait_serving(container, credentials)
        assert health_status(container.target) is None  # plaintext: refused
        remote = _lower(_export("mlp"), RemotePartitioner(
            container.target, "xnnpack", token=container.token, credentials=credentials,
            timeout=LOWER_TIMEOUT_S))
        assert remote == local_pte("mlp", "xnnpack")
        check = container.inspect()["Config"]["Healthcheck"]
        assert "--tls" in " ".join(check["Test"])
        bound = (check["StartPeriod"] + check["Interval"] * (check["Retries"] + 2)) / 1e9
        deadline = time.monotonic() + bound
        while container.inspect()["State"]["Health"]["Status"] != "healthy":
            assert time.monotonic() < deadline, container.inspect()["State"]["Health"]
            time.sleep(1)



# ------------------------------------------------------------- environments behind one address

IMAGE_ARM = os.environ.get("RP_IMAGE_ARM", "remote-partitioner-arm:0.1.0")
IMAGE_OPENVINO = os.environ.get("RP_IMAGE_OPENVINO", "remote-partitioner-openvino:0.1.0")
IMAGE_ROUTER = os.environ.get("RP_IMAGE_ROUTER", "remote-partitioner-router:0.1.0")
ARM_PYTHON = Path(os.environ.get("ARM_PYTHON", ROOT / ".venv-arm" / "bin" / "python"))
OPENVINO_PYTHON = Path(
    os.environ.get("OPENVINO_PYTHON", ROOT / ".venv-openvino" / "bin" / "python"))
#: Each environment's lowering script (tests/arm_flow.py, tests/openvino_flow.py) and Python.
FLOWS = {"arm": (ARM_PYTHON, Path(__file__).with_name("arm_flow.py")),
         "openvino": (OPENVINO_PYTHON, Path(__file__).with_name("openvino_flow.py"))}
ENVIRONMENTS = "deploy/k8s/overlays/environments"


def _selects(service: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    selector = service["spec"].get("selector") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _flow(environment: str, mode: str, jobs: list[dict[str, Any]], target: str = "",
          token: str = "") -> dict[str, Any]:
    python, script = FLOWS[environment]
    return run_flow(python, script, mode, jobs, target, token)


def test_environments_overlay(tmp_path: Path) -> None:
    """deploy/k8s/overlays/environments run as it says: the default server's image, the Arm
    and OpenVINO environments' (``make image-arm image-openvino``) and the front door's (``make
    image-router``), each container on one Docker network under the names of the Services that
    select its pods, the router's configuration from the rendered ConfigMap. Through the
    router's one address: the listing names every environment; an XNNPACK lowering equals the
    local one; a client with Arm's toolchain blocked quantizes and lowers for TOSA and
    Ethos-U55 and gets the bytes of a local lowering in the Arm environment; one with
    OpenVINO's blocked quantizes and lowers for OpenVINO and gets the local program (up to
    OpenVINO's counter-made names, ``normalize_openvino``); and the default server, reached
    directly, refuses a call for the Arm environment (WRONG_ENVIRONMENT)."""
    objects = rendered(ENVIRONMENTS)
    deployments = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Deployment"}
    images = {"remote-partitioner": IMAGE, "remote-partitioner-arm": IMAGE_ARM,
              "remote-partitioner-openvino": IMAGE_OPENVINO,
              "remote-partitioner-router": IMAGE_ROUTER}
    assert set(deployments) == set(images)
    for image in images.values():
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                          timeout=60, check=False).returncode != 0:
            pytest.fail(f"the image {image} is not built "
                        "(make image image-arm image-openvino image-router)")
    for environment, (python, _) in FLOWS.items():
        if not python.exists():
            pytest.fail(f"the {environment} environment is missing: {python} "
                        f"(make venv-{environment})")
    aliases: dict[str, list[str]] = {name: [] for name in deployments}
    for service in (o for o in objects if o["kind"] == "Service"):
        selected = [n for n, d in deployments.items() if _selects(service, d)]
        assert len(selected) <= 1, (service["metadata"]["name"], selected)
        if selected:
            aliases[selected[0]].append(service["metadata"]["name"])
    token = secrets.token_urlsafe(24)
    token_dir = tmp_path / "token"
    token_dir.mkdir()
    (token_dir / "tokens").write_text(token + "\n")
    token_file = tmp_path / "client-token"
    token_file.write_text(token + "\n")
    mounted = {"remote-partitioner-token": token_dir}
    for config in (o for o in objects if o["kind"] == "ConfigMap"):
        folder = tmp_path / config["metadata"]["name"]
        folder.mkdir()
        for key, value in config.get("data", {}).items():
            (folder / key).write_text(value)
        mounted[config["metadata"]["name"]] = folder
    network = f"rp-environments-{SESSION}"
    _docker("network", "create", "--label", f"{LABEL}={SESSION}", network)
    started: dict[str, Container] = {}
    try:
        for name in ("remote-partitioner-arm", "remote-partitioner-openvino", "remote-partitioner",
                     "remote-partitioner-router"):
            run_args = docker_run_args(deployments[name], mounted, images[name])
            at = run_args.index(images[name])
            names = [a for alias in aliases[name] for a in ("--network-alias", alias)]
            run_args[at:at] = ["--network", network, *names]
            cid = _docker("run", *run_args).strip()
            started[name] = Container(cid, _published(cid), token, token_file)
        for name in ("remote-partitioner-arm", "remote-partitioner-openvino",
                     "remote-partitioner"):
            wait_serving(started[name])
        router = started["remote-partitioner-router"]
        (port,) = router.ports
        router_target = router.ports[port]
        deadline = time.monotonic() + STARTUP_S
        while health_status(router_target) != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, router.logs()[-4000:]
            time.sleep(0.5)

        listed = _cli("list", "--target", router_target, "--token-file", str(token_file))
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[1].startswith("environment arm: server "), lines[:3]
        assert lines[2].startswith("environment openvino: server "), lines[:3]
        for hosted, environment in (("arm_tosa", "arm"), ("ethos_u55", "arm"),
                                    ("ethos_u85", "arm"), ("openvino", "openvino")):
            assert any(line.startswith(f"{hosted}  ")
                       and line.endswith(f"[environment {environment}]")
                       for line in lines), hosted
        assert any(line.startswith("xnnpack  XnnpackBackend") for line in lines)

        remote = _lower(_export("mlp"), RemotePartitioner(
            router_target, "xnnpack", token=token, timeout=LOWER_TIMEOUT_S))
        assert remote == local_pte("mlp", "xnnpack")

        jobs = {mode: [
            {"name": "arm_tosa", "spec": {}, "quantize": False, "model": "linear",
             "out": str(tmp_path / f"{mode}-tosa.pte")},
            {"name": "ethos_u55", "spec": {"extra_flags": "--arena-cache-size=2097152"},
             "quantize": True, "model": "conv", "out": str(tmp_path / f"{mode}-u55.pte")},
        ] for mode in ("local", "remote")}
        want = _flow("arm", "local", jobs["local"])
        got = _flow("arm", "remote", jobs["remote"], router_target, token)
        assert got["arm_modules_loaded"] == [] and got["rng_after"] == want["rng_after"]
        for a, b in zip(jobs["local"], jobs["remote"], strict=True):
            assert Path(a["out"]).read_bytes() == Path(b["out"]).read_bytes(), a["name"]

        jobs = {mode: [
            {"spec": {}, "quantize": True, "model": "conv",
             "out": str(tmp_path / f"{mode}-openvino.pte")},
        ] for mode in ("local", "remote")}
        want = _flow("openvino", "local", jobs["local"])
        got = _flow("openvino", "remote", jobs["remote"], router_target, token)
        assert got["openvino_modules_loaded"] == [] and got["rng_after"] == want["rng_after"]
        for a, b in zip(jobs["local"], jobs["remote"], strict=True):
            assert normalize_openvino(Path(a["out"]).read_bytes()) == normalize_openvino(
                Path(b["out"]).read_bytes())

        direct = RemotePartitioner(started["remote-partitioner"].target, "ethos_u55",
                                   token=token, timeout=LOWER_TIMEOUT_S)
        with pytest.raises(RemotePartitionerError) as e:
            _lower(_export("mlp"), direct)
        assert e.value.reason == "WRONG_ENVIRONMENT", e.value
    finally:
        for container in started.values():
            _docker("rm", "-f", container.id, check=False)
        _docker("network", "rm", network, check=False)
