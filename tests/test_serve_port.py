"""A server's port is its own: a second server on it is refused, clearly, and the first keeps
serving; only ``serve --workers`` shares a port, among its own workers (tests/test_workers.py
shows the sharing)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.server.app import BindError, Server, create_server
from remote_partitioner.server.cli import EXIT_CANNOT_LISTEN
from remote_partitioner.server.workers import port_is_free

#: A second `serve` imports torch and ExecuTorch before it binds.
SERVE_SECONDS = 240


def serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=30
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture()
def first() -> Iterator[tuple[Server, str]]:
    """A server holding a free loopback port, started."""
    with inproc_server() as served:
        yield served


def serve(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """`remote-partitioner serve ARGS` until it exits by itself (refused): its exit status,
    stdout and stderr. One that starts serving instead is killed and the test fails at once."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "remote_partitioner.cli", "serve", *args],
            stdout=o, stderr=e, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        try:
            deadline = time.monotonic() + SERVE_SECONDS
            while proc.poll() is None and time.monotonic() < deadline:
                if "serving" in out.read_text():
                    pytest.fail(f"the second server started: {out.read_text()!r}")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
    return proc.returncode, out.read_text(), err.read_text()


def test_a_second_server_in_process_is_refused(first: tuple[Server, str]) -> None:
    _, target = first
    for share_port in (False, True):  # sharing needs both sides to share
        with pytest.raises(BindError, match=f"cannot bind {target}"):
            create_server(target, share_port=share_port)
    assert serving(target)


def test_servers_that_share_the_port_both_bind() -> None:
    """What ``--workers`` relies on: two servers that both ask to share a port get it."""
    a, port = create_server("127.0.0.1:0", share_port=True)
    try:
        b, again = create_server(f"127.0.0.1:{port}", share_port=True)
        b.stop(None).wait(30)
        assert again == port
    finally:
        a.stop(None).wait(30)


@pytest.mark.slow  # a `serve` process imports torch and ExecuTorch before it binds
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_an_address_in_use(
    first: tuple[Server, str], workers: str, tmp_path: Path
) -> None:
    """`serve` (one process, or a --workers group) on a port another server holds exits
    EXIT_CANNOT_LISTEN with a message naming the address, and prints no "serving" line; the
    other server keeps serving."""
    _, target = first
    code, stdout, stderr = serve(tmp_path, "--address", target, "--workers", workers)
    assert code == EXIT_CANNOT_LISTEN, (stdout, stderr[-2000:])
    assert "serving" not in stdout
    assert f"remote-partitioner serve: cannot listen on {target}: the address is in use" in (
        stderr
    )
    assert serving(target)


def test_a_stopped_servers_port_is_free_again() -> None:
    """`serve --workers` checks the port before it starts: held while a socket listens on it,
    free once that socket closed, even with its connections in TIME_WAIT (a restart)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's listeners
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert not port_is_free(address)
        with socket.create_connection(listener.getsockname(), timeout=10) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            assert client.recv(1) == b""
    assert port_is_free(address)


@pytest.mark.parametrize(("family", "missing"), [("arm", "tosa_serializer|ethosu"),
                                                 ("openvino", "openvino|nncf")])
def test_serve_refuses_a_backend_family_it_cannot_host(
    tmp_path: Path, family: str, missing: str
) -> None:
    """`serve --backends arm` where tosa-tools is not installed (this environment; OpenVINO
    likewise) does not start a server hosting less than it was told to: it exits 2 naming the
    family, the missing module and the make target that builds its environment."""
    code, stdout, stderr = serve(tmp_path, "--address", "127.0.0.1:0", "--backends", family)
    assert code == 2, (stdout, stderr[-2000:])
    assert "serving" not in stdout
    assert re.search(
        rf"remote-partitioner serve: --backends {family}: cannot be hosted here: "
        rf"ModuleNotFoundError: No module named '({missing})' \(`make venv-{family}` builds its "
        r"environment\)",
        stderr,
    ), stderr[-2000:]
