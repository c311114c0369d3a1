"""Shared fixtures: a real server process on a free loopback port, and an in-process one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

STARTUP_SECONDS = 180


def modules_loaded_by(code: str, roots: set[str], timeout: float = 120) -> list[str]:
    """The modules under ``roots`` (top-level package names) that a fresh interpreter has
    loaded after running ``code``, sorted: what importing something light drags in."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(roots)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=timeout)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def wait_serving(target: str, deadline: float) -> None:
    """Poll grpc.health.v1 until SERVING; bounded by ``deadline`` (time.monotonic())."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"server at {target} did not report SERVING in time")


@contextlib.contextmanager
def plugin_distribution(
    root: Path, module: str, source: str, entry_point: str,
    group: str = "remote_partitioner.partitioners",
) -> Iterator[None]:
    """Install, for this process and the servers it starts, a one-module distribution that
    registers ``entry_point`` ("name = module:ATTR") in the entry point ``group`` (the
    partitioner plugins' by default, or ``remote_partitioner.backends``): the same path a
    third-party package takes. ``source`` is the module's code."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir()
    name = module.replace("_", "-")
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), saved) if p)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(module, None)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _start(log_dir: Path, *args: str) -> tuple[subprocess.Popen[str], IO[str]]:
    """Start `remote-partitioner serve ARGS` in its own process, on a free port of 127.0.0.1,
    without waiting for it; returns the process and its log file. The log goes to a file (a
    pipe nobody reads would fill up and block the server)."""
    log = (log_dir / "server.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote_partitioner.cli", "serve",
         "--address", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return proc, log


@contextlib.contextmanager
def _served(proc: subprocess.Popen[str], log: IO[str]
            ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Wait until the server :func:`_start` started is SERVING; yield it and its target;
    stop it on exit."""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + STARTUP_SECONDS
        line = proc.stdout.readline()
        match = re.search(r" on (127\.0\.0\.1:\d+)$", line.strip())
        if match is None:
            proc.kill()
            proc.communicate(timeout=30)
            log.seek(0)
            raise RuntimeError(f"server did not start: {line!r}\n{log.read()[-4000:]}")
        target = match.group(1)
        wait_serving(target, deadline)
        yield proc, target
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        log.close()


@contextlib.contextmanager
def _serve(
    tmp_path_factory: pytest.TempPathFactory, *args: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`remote-partitioner serve ARGS` in its own process, on a free port of 127.0.0.1,
    SERVING; yields (process, target) and stops it on exit."""
    with _served(*_start(tmp_path_factory.mktemp("server"), *args)) as served:
        yield served


#: The session server, started when the session starts (:func:`pytest_sessionstart`) so that
#: its imports (about 10 s) run on the other core while this process collects the tests;
#: :func:`server_process` takes it. Its log's directory.
_EARLY_SERVER: list[tuple[subprocess.Popen[str], IO[str]]] = []
_EARLY_LOG_DIR: list[Path] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return  # no test runs: a server would only compete with collection
    _EARLY_LOG_DIR.append(Path(tempfile.mkdtemp(prefix="rp-session-server-")))
    _EARLY_SERVER.append(_start(_EARLY_LOG_DIR[0]))


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _EARLY_SERVER:  # no test asked for it: stop it
        proc, log = _EARLY_SERVER.pop()
        proc.kill()
        proc.communicate(timeout=30)
        log.close()
    while _EARLY_LOG_DIR:
        shutil.rmtree(_EARLY_LOG_DIR.pop(), ignore_errors=True)


@pytest.fixture(scope="session")
def server_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`remote-partitioner serve` with default settings, shared by the session (started with
    the session)."""
    started = _EARLY_SERVER.pop() if _EARLY_SERVER else _start(tmp_path_factory.mktemp("server"))
    with _served(*started) as served:
        yield served


@pytest.fixture(scope="session")
def uncached_server_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server whose result cache is off, so that every hook call runs the partitioner."""
    with _serve(tmp_path_factory, "--result-cache-bytes", "0") as served:
        yield served


@pytest.fixture(scope="session")
def server_address(server_process: tuple[subprocess.Popen[str], str]) -> str:
    """The target string of the session's server process."""
    return server_process[1]


@pytest.fixture()
def inproc_server() -> Iterator[tuple[object, str]]:
    """A server in this process (for tests that look at its blob store); yields (servicer
    pieces, target)."""
    from remote_partitioner.server.app import create_server
    from remote_partitioner.server.blobstore import BlobStore

    store = BlobStore()
    server, port = create_server("127.0.0.1:0", blob_store=store)
    server.start()
    try:
        yield store, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=1).wait(timeout=30)
