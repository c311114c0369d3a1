"""``serve --workers N``: N server processes on one port, gRPC's pre-fork pattern.

gRPC Python serves a process's calls with one interpreter, and ExecuTorch's partitioners hold
the GIL and process-wide state, so one process partitions on one core. To use N cores, a small
supervisor (this module) checks that no other socket holds the port, reserves it, starts N
``serve --share-port`` processes that each bind it with ``SO_REUSEPORT`` (a plain ``serve``
does not, so that it refuses a port another server holds), and the kernel spreads incoming
connections over them. A channel is one connection, so every call of one client stays on one
worker; the workers also share one blob store directory, so a client that reconnects to
another worker finds the blobs it uploaded (see ``examples/python/multiprocessing`` in grpc).

The supervisor itself never creates a gRPC object (gRPC must not be initialized in a process
that forks), starts its workers as fresh interpreters, forwards SIGTERM/SIGINT to them, waits
for them to finish their calls, and restarts a worker that dies on its own.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

logger = logging.getLogger("remote_partitioner.server")

#: The module each worker process runs (``python -m``): the server's own serve-only entry
#: point, not the console script's package (:mod:`remote_partitioner.cli`), so that a worker
#: loads no client code and server/ depends on nothing above it.
WORKER_MODULE = "remote_partitioner.server.cli"
#: The line a ``serve`` process prints once it listens (the tests and the demo read it).
LISTENING = re.compile(r" on (\S+:\d+)$")
#: How long a worker may take to start listening.
STARTUP_SECONDS = 300.0
#: A worker that dies is restarted, at most this often.
RESTART_BACKOFF_SECONDS = 5.0


@contextlib.contextmanager
def reserve_port(host: str, port: int) -> Iterator[int]:
    """Bind (not listen) ``host:port`` with ``SO_REUSEPORT`` and hold it while the block runs,
    so that port 0 becomes one definite free port that the workers can all bind."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0:
            raise RuntimeError("SO_REUSEPORT is not supported here: --workers needs it")
        sock.bind((host.strip("[]"), port))
        yield sock.getsockname()[1]
    finally:
        sock.close()


def port_is_free(address: str) -> bool:
    """Whether ``address`` (``HOST:PORT``) can be bound by a socket that shares nothing: False
    while any other socket holds the port, with ``SO_REUSEPORT`` or without (another server,
    or another ``--workers`` group). Connections of a server that stopped, still in TIME_WAIT,
    do not hold it (``SO_REUSEADDR``, as gRPC binds). Port 0 is always free.

    A check, then the supervisor's bind: two groups started in the same instant could both
    pass it; a group started beside a running server, or restarted, is answered right."""
    host, port = _split_address(address)
    if port == 0:
        return True
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--address {address!r} is not HOST:PORT")
    return host, int(port)


class _Worker:
    """One ``serve`` process and the thread that copies its output to ours."""

    def __init__(self, index: int, argv: Sequence[str]) -> None:
        self.index = index
        self.argv = list(argv)
        self.proc: subprocess.Popen[str] | None = None
        self.started = 0.0

    def spawn(self) -> None:
        """Start the process (it needs a while to import ExecuTorch before it listens)."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, *self.argv],
            stdout=subprocess.PIPE, text=True,
        )

    def wait_listening(self) -> str:
        """Wait until the process listens; return the line it printed (RuntimeError if it
        printed something else, exited or took longer than ``STARTUP_SECONDS``)."""
        assert self.proc is not None and self.proc.stdout is not None
        line = _readline(self.proc.stdout, STARTUP_SECONDS)
        if not LISTENING.search(line.strip()):
            self.proc.kill()
            raise RuntimeError(f"worker {self.index} did not start: {line.strip()!r}")
        threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True).start()
        return line.strip()

    def start(self) -> str:
        self.spawn()
        return self.wait_listening()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


def _readline(stream: IO[str], timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0] if out else ""


def _drain(stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()


def supervise(argv: Sequence[str], address: str, workers: int, blob_dir: str | None,
              grace: float, metrics_port: int | None) -> int:
    """Run ``serve`` ``argv`` as ``workers`` processes sharing ``address``'s port; return the
    exit status once SIGTERM or SIGINT stopped them all.

    Each worker gets ``--address HOST:PORT --workers 1 --share-port`` (the reserved port,
    bound with ``SO_REUSEPORT``) and
    ``--blob-dir`` (``blob_dir``, or a temporary directory removed at exit); with
    ``metrics_port`` P (not 0), worker i serves its metrics on P + i.
    """
    host, port = _split_address(address)
    own_dir = blob_dir is None
    directory = blob_dir or tempfile.mkdtemp(prefix="remote-partitioner-blobs-")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        with reserve_port(host, port) as port:
            def args(i: int) -> list[str]:
                extra = ["--address", f"{host}:{port}", "--workers", "1", "--share-port",
                         "--blob-dir", directory]
                if metrics_port:
                    extra += ["--metrics-port", str(metrics_port + i)]
                return [*argv, *extra]

            pool = [_Worker(i, args(i)) for i in range(workers)]
            first = ""
            try:
                for w in pool:
                    w.spawn()
                for w in pool:
                    first = w.wait_listening()
            except RuntimeError:
                for w in pool:
                    w.signal(signal.SIGKILL)
                raise
            served = LISTENING.sub("", first.removeprefix("remote-partitioner "))
            print(f"remote-partitioner {served} with {workers} workers on {host}:{port}",
                  flush=True)
            while not stop.wait(0.5):
                for w in pool:
                    assert w.proc is not None
                    if w.proc.poll() is not None and not stop.is_set():
                        logger.warning("worker %d exited with %s; restarting it", w.index,
                                       w.proc.returncode)
                        time.sleep(max(0.0, w.started + RESTART_BACKOFF_SECONDS
                                       - time.monotonic()))
                        with contextlib.suppress(RuntimeError):
                            w.start()
            for w in pool:
                w.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace + 10.0
            status = 0
            for w in pool:
                assert w.proc is not None
                try:
                    code = w.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    w.signal(signal.SIGKILL)
                    code = w.proc.wait()
                status = status or (code if code and code > 0 else 0)
            return status
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
