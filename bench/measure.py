"""The benchmark's instruments: CPU pinning, process CPU time from /proc, the loopback rate,
and a server's Prometheus counters.

Pinning: with two CPUs or more, the benchmark runs every client (its own process, the client
processes it starts, the command-line clients) on CPU 0 and every server on CPU 1, so that
the two sides of a lowering do not take turns on one core while the other core idles, and
neither is moved mid-measurement. ``--no-pin`` leaves placement to the kernel.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

CLIENT_CPU = 0
SERVER_CPU = 1
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- pinning


def can_pin() -> bool:
    """Whether there are two CPUs to split between client and server."""
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


def all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def pin_self(cpu: int | None) -> None:
    """Pin the calling thread (and the threads and processes it starts from now on) to ``cpu``;
    None: to every CPU."""
    os.sched_setaffinity(0, {cpu} if cpu is not None else all_cpus())


def preexec_pin(cpu: int | None) -> Callable[[], None]:
    """A ``preexec_fn`` placing the child, before it runs anything, on ``cpu`` (None: on
    every CPU), so that every thread it starts inherits it."""
    cpus = {cpu} if cpu is not None else all_cpus()
    return lambda: os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def unpinned(active: bool) -> Iterator[None]:
    """The calling thread on every CPU for the block (throughput: the clients' threads)."""
    if not active:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, all_cpus())
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# ---------------------------------------------------------------------------- CPU time


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time of a process, all its threads (``/proc/PID/stat`` fields 14 and
    15, in clock ticks); 0.0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm) ": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and of its live descendants (``serve --workers N``'s workers)."""
    return cpu_seconds(pid) + sum(tree_cpu_seconds(c) for c in _children(pid))


class CpuClock:
    """Reads the client's (this process's) and a server's CPU seconds together."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def read(self) -> tuple[float, float, float]:
        """(wall, client CPU, server CPU) seconds now; server CPU is nan without a pid."""
        server = tree_cpu_seconds(self.server_pid) if self.server_pid else float("nan")
        return time.perf_counter(), cpu_seconds(), server


def span(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict[str, float]:
    """The wall and CPU seconds between two :meth:`CpuClock.read` samples."""
    return {"wall_s": b[0] - a[0], "client_cpu_s": b[1] - a[1], "server_cpu_s": b[2] - a[2]}


# ---------------------------------------------------------------------------- loopback rate

# The receiving side: accepts one connection, reads until EOF, answers with the byte count.
_RECEIVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
buf = bytearray(1 << 20); view = memoryview(buf); n = 0
while True:
    k = c.recv_into(view)
    if not k:
        break
    n += k
c.sendall(n.to_bytes(8, "big")); c.close()
"""


def loopback_rate(total: int = 512 << 20, rounds: int = 3, pin: bool = True) -> dict[str, Any]:
    """Raw TCP throughput over 127.0.0.1, this process sending ``total`` bytes in 1 MiB
    ``sendall`` calls to a receiver process (on the server's CPU when pinned) that reads them
    into one reused buffer and acknowledges the count: the rate no protocol on this machine's
    loopback can beat. ``rounds`` transfers; bytes per second of the fastest and the median."""
    chunk = os.urandom(1 << 20)
    seconds: list[float] = []
    for _ in range(rounds):
        receiver = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True,
            preexec_fn=preexec_pin(SERVER_CPU) if pin else None,
        )
        try:
            assert receiver.stdout is not None
            port = int(receiver.stdout.readline())
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                t = time.perf_counter()
                sent = 0
                while sent < total:
                    s.sendall(chunk)
                    sent += len(chunk)
                s.shutdown(socket.SHUT_WR)
                ack = b""
                while len(ack) < 8:
                    part = s.recv(8 - len(ack))
                    if not part:
                        break
                    ack += part
                seconds.append(time.perf_counter() - t)
            if int.from_bytes(ack, "big") != sent:
                raise RuntimeError(f"loopback: sent {sent} bytes, the receiver counted {ack!r}")
        finally:
            receiver.wait(60)
    return {"method": "raw TCP over 127.0.0.1, 1 MiB sendall, receiver process",
            "bytes": total, "samples_s": seconds,
            "bytes_per_s": total / min(seconds),
            "median_bytes_per_s": total / statistics.median(seconds)}


# ---------------------------------------------------------------------------- server metrics


def scrape(port: int) -> dict[str, float]:
    """A server's Prometheus text (``serve --metrics-port``) as ``{'name{labels}': value}``,
    samples of the counters and gauges only (no histogram buckets); {} if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "_bucket{" in line or "_created" in line:
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def delta(before: dict[str, float], after: dict[str, float],
          keep: Sequence[str] = ("cache", "hit", "miss", "received_bytes", "sent_bytes")
          ) -> dict[str, float]:
    """The samples among ``keep`` (substrings of the name) that changed between scrapes."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if any(w in k for w in keep) and v != before.get(k, 0.0)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
