"""The tests' servers: one factory for a server in this process (:func:`inproc_server`) and one
launcher for ``remote-partitioner serve`` in a process of its own (:func:`launch`, then
:func:`served`; or both at once, :func:`serve_process`). Each has one shutdown, and the
launcher waits for start-up with a deadline."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

#: Seconds a server process may take to print its address and report SERVING (its imports
#: take about 10 s alone; a loaded 2-core machine takes much longer).
STARTUP_SECONDS = 180
#: Seconds a server is given to stop before it is killed (a process) or reported (in process).
STOP_SECONDS = 30
#: The line ``serve`` prints once it serves: "remote-partitioner serving ... on HOST:PORT".
SERVING_LINE = r" on (127\.0\.0\.1:\d+)$"


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


# --------------------------------------------------------------------------------------------
# In this process


@contextlib.contextmanager
def silent_target() -> Iterator[str]:
    """A loopback address that listens and never speaks: the kernel completes the TCP
    handshake (the backlog), but no HTTP/2 settings ever come back, so a call's deadline
    passes whatever the machine's speed. (A tiny deadline against a real server can be met:
    gRPC rounds deadlines to milliseconds, and a warm local call fits in one.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def inproc_server(**kwargs: Any) -> Iterator[tuple[Any, str]]:
    """``create_server("127.0.0.1:0", **kwargs)``, started; yields (server, target) and stops
    it on exit (calls in flight are cancelled), failing if it does not stop in
    :data:`STOP_SECONDS`."""
    from remote_partitioner.server.app import create_server

    server, port = create_server("127.0.0.1:0", **kwargs)
    try:
        server.start()
        yield server, f"127.0.0.1:{port}"
    finally:
        if not server.stop(None).wait(STOP_SECONDS):
            raise RuntimeError(f"the in-process server did not stop within {STOP_SECONDS} s")


# --------------------------------------------------------------------------------------------
# In a process of its own


class Launched:
    """A ``remote-partitioner serve`` process :func:`launch` started: ``proc``, its stderr's
    file ``log``, and its stdout lines as they come (a thread reads them, so the pipe never
    fills and a wait for a line has a deadline)."""

    def __init__(self, proc: subprocess.Popen[str], log: Path, log_file: IO[str]) -> None:
        self.proc, self.log, self._log_file = proc, log, log_file
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="serve-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output: the process exited

    def wait_line(self, pattern: str, deadline: float) -> re.Match[str]:
        """The first stdout line that matches ``pattern``, waiting until ``deadline``
        (time.monotonic()) at most.

        Raises:
            RuntimeError: the process exited, or the deadline passed, before such a line (the
                message has the lines seen and the log's end).
        """
        seen: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            match = re.search(pattern, line.strip())
            if match is not None:
                return match
        raise RuntimeError(
            f"server did not start (exit code {self.proc.poll()}): {seen!r}\n"
            f"{self.log.read_text(errors='replace')[-4000:]}"
        )

    def stop(self) -> None:
        """Terminate the process (SIGTERM: it shuts down gracefully), kill it if it has not
        exited in :data:`STOP_SECONDS`, and close its log. Idempotent."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_SECONDS)
            self._reader.join(STOP_SECONDS)
        finally:
            self._log_file.close()


def launch(
    log: Path, *args: str, env: Mapping[str, str | None] | None = None,
    python: str = sys.executable,
) -> Launched:
    """Start ``remote-partitioner serve --address 127.0.0.1:0 ARGS`` without waiting for it;
    its stderr goes to the file ``log``; ``env`` adds to this process's environment (a None
    value removes that variable); ``python`` is the interpreter of the environment it runs in
    (this one by default)."""
    merged = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    log_file = log.open("w")
    try:
        proc = subprocess.Popen(
            [python, "-m", "remote_partitioner.cli", "serve",
             "--address", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
            env={k: v for k, v in merged.items() if v is not None},
        )
    except BaseException:
        log_file.close()
        raise
    return Launched(proc, log, log_file)


@contextlib.contextmanager
def served(
    launched: Launched, pattern: str = SERVING_LINE, startup_seconds: float = STARTUP_SECONDS,
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """Wait (at most ``startup_seconds``) for the line ``pattern`` (one group: the target)
    and for SERVING; yield (process, target, log) and stop the process on exit."""
    try:
        deadline = time.monotonic() + startup_seconds
        target = launched.wait_line(pattern, deadline).group(1)
        wait_serving(target, deadline)
        yield launched.proc, target, launched.log
    finally:
        launched.stop()


@contextlib.contextmanager
def serve_process(
    log: Path, *args: str, env: Mapping[str, str | None] | None = None,
    pattern: str = SERVING_LINE,
    python: str = sys.executable,
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """:func:`launch` then :func:`served`: ``remote-partitioner serve ARGS`` on a free port
    of 127.0.0.1, SERVING; yields (process, target, log) and stops it on exit."""
    with served(launch(log, *args, env=env, python=python), pattern) as s:
        yield s


# --------------------------------------------------------------------------------------------
# The front door: Debian's nginx routing by environment
# (deploy/k8s/overlays/environments/nginx.conf)

#: The front door's configuration: the file deploy/k8s/overlays/environments mounts.
ROUTER_CONF = (Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "overlays"
               / "environments" / "nginx.conf")


#: A loopback address nothing listens on (port 1, tcpmux: privileged and unused).
CLOSED_PORT = "127.0.0.1:1"


def front_door_config(listen: str, upstreams: Mapping[str, str]) -> str:
    """:data:`ROUTER_CONF` with its ``listen`` address replaced by ``listen`` and each
    ``upstream env_NAME``'s server by ``upstreams[NAME]`` ("default" for the default
    environment), or, for an environment ``upstreams`` does not name, by a loopback port
    nothing listens on (:data:`CLOSED_PORT`: calls routed there are answered UNAVAILABLE);
    nothing else changes."""
    text = ROUTER_CONF.read_text()
    text, n = re.subn(r"(?m)^(\s*listen )\S+( http2;)$", rf"\g<1>{listen}\g<2>", text)
    assert n == 1, "the configuration's listen line changed shape"
    named = set(re.findall(r"upstream env_(\w+) {", text))
    assert set(upstreams) <= named, f"no upstreams {set(upstreams) - named} in {ROUTER_CONF}"
    upstreams = {**{name: CLOSED_PORT for name in named}, **upstreams}
    for name, target in upstreams.items():
        text, n = re.subn(rf"(upstream env_{name} {{ server )\S+(;)", rf"\g<1>{target}\g<2>", text)
        assert n == 1, f"no upstream env_{name} in {ROUTER_CONF}"
    left = re.findall(r"upstream env_\w+ { server (\S+);", text)
    assert all(t.startswith("127.0.0.1:") for t in left), f"upstreams not replaced: {left}"
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def front_door(directory: Path, upstreams: Mapping[str, str]) -> Iterator[str]:
    """Debian's nginx with :func:`front_door_config` on a free loopback port, in the
    foreground; yields its target once it accepts connections and stops it on exit
    (SIGQUIT: graceful, then killed after :data:`STOP_SECONDS`).

    Without nginx (``apt-get install nginx-light``; ``.ci/run`` installs it) the calling test
    is skipped, or failed when ``CI`` is true.
    """
    nginx = "/usr/sbin/nginx"
    if not Path(nginx).exists():
        missing = f"{nginx}: Debian's nginx is not installed (nginx-light)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(missing)
    directory.mkdir(parents=True, exist_ok=True)
    for attempt in range(5):
        listen = f"127.0.0.1:{_free_port()}"
        conf = directory / "nginx.conf"
        conf.write_text(front_door_config(listen, upstreams))
        log = (directory / "error.log").open("w")
        proc = subprocess.Popen(
            [nginx, "-p", str(directory), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
            stdout=log, stderr=log,
        )
        host, port = listen.rsplit(":", 1)
        deadline = time.monotonic() + 10
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex((host, int(port))) == 0:
                    up = True
                    break
            time.sleep(0.05)
        if up and proc.poll() is None:
            break
        proc.kill()
        proc.wait(STOP_SECONDS)
        log.close()
        if attempt == 4:
            raise RuntimeError(f"nginx did not start: {(directory / 'error.log').read_text()}")
    try:
        yield listen
    finally:
        proc.send_signal(3)  # SIGQUIT: graceful shutdown
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_SECONDS)
        log.close()
