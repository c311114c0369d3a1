"""The benchmark: remote vs local lowering, wall and CPU time, bytes on the wire, memory, and
throughput, against the targets of issue 35 (bench/README.md states each case's floor).

For each model it starts a fresh server process on a free loopback port and, in a fresh client
process, lowers the model with ``to_edge_transform_and_lower(...).to_executorch()``: with the
local ``XnnpackPartitioner``, then with a ``RemotePartitioner`` on the new (cold) server, then
alternately with another ``RemotePartitioner`` on the now warm server and locally again. Every
remote ``.pte`` must equal the local one, byte for byte; a difference fails the benchmark.
Further cases: preprocess on the server (cold and warm), the ``Lower`` RPC through the command
line (cold, again, on a replica sharing ``--blob-dir``, after a restart), a server restarted on
its ``--blob-dir``, and partition throughput with 1 and 2 server workers.

With two CPUs or more the servers run on CPU 1 and every client on CPU 0 (``--no-pin``: the
kernel places them). Each lowering is timed per phase (``to_edge_transform_and_lower``,
``to_executorch``): wall time, and the CPU time (user + system, from ``/proc/PID/stat``) of the
client process and of the server process, sampled before and after each phase.

It prints a table and writes every figure as JSON::

    python bench/bench.py                       # make bench
    python bench/bench.py --models linear mv2 --no-llama --no-huge --json out.json
    python bench/bench.py --cases lower restart --case-model add_mul   # one case, small
    python bench/bench.py --llama-only          # the llama2 cases of the targets table
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import measure

EXAMPLE_MODELS = [
    "linear", "add_mul", "softmax", "conv1d", "lstm", "ds_cnn", "deep_autoencoder",
    "mobilenet_v1_025", "resnet8", "sdpa",
]
LLAMA = "llama2"
HUGE = "huge"  # a generated MLP whose tensors exceed 2 GiB
HOOKS = ("transform_for_pre_decomposition", "ops_to_not_decompose", "partition")
STARTUP_SECONDS = 300.0
_LISTENING = re.compile(r" on (\S+:\d+)$")
GIB = 1 << 30
PHASES = ("to_edge_transform_and_lower", "to_executorch")
CASES = ("examples", "llama", "huge", "lower", "restart", "throughput")
#: Whether servers go on measure.SERVER_CPU (and clients stay on measure.CLIENT_CPU): set by
#: main(), off for a module that imports server() (bench/load.py).
PIN = {"on": False}


# ---------------------------------------------------------------------------- processes


def peak_rss(pid: int | str = "self") -> int:
    """A process's peak resident set size in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@dataclasses.dataclass
class Server:
    """A running ``serve`` process: its pid, its target and its metrics port (None: off)."""

    proc: subprocess.Popen[str]
    target: str
    metrics_port: int | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> dict[str, float]:
        return measure.scrape(self.metrics_port) if self.metrics_port else {}


@contextlib.contextmanager
def server(*args: str, metrics: bool = False,
           pinned: bool = True) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``remote-partitioner serve`` on a free port of 127.0.0.1, stopped on exit; on
    ``measure.SERVER_CPU`` when the benchmark pins (and ``pinned``), else on every CPU."""
    with served(*args, metrics=metrics, pinned=pinned) as s:
        yield s.proc, s.target


@contextlib.contextmanager
def served(*args: str, metrics: bool = False, pinned: bool = True) -> Iterator[Server]:
    """As :func:`server`, as a :class:`Server` (with ``metrics``: ``--metrics-port``)."""
    port = measure.free_port() if metrics else None
    extra = ["--metrics-port", str(port)] if port else []
    cpu = measure.SERVER_CPU if PIN["on"] and pinned else None
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "remote_partitioner.cli", "serve",
             "--address", "127.0.0.1:0", *extra, *args],
            stdout=subprocess.PIPE, stderr=log, text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            preexec_fn=measure.preexec_pin(cpu) if measure.can_pin() else None,
        )
        try:
            assert proc.stdout is not None
            line = _readline(proc.stdout, STARTUP_SECONDS)
            match = _LISTENING.search(line.strip())
            if match is None:
                log.seek(0)
                raise RuntimeError(f"server did not start: {line!r}\n{log.read()[-3000:]}")
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            yield Server(proc, match.group(1), port)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _readline(stream: Any, timeout: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else ""


def memory_file_bytes(pid: int | str = "self") -> int:
    """Bytes a process holds in anonymous memory files (``memfd``, where the in-memory blob
    store keeps large blobs): shared memory, not in its RSS unless mapped."""
    total = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith("/memfd:"):
                total += os.stat(fd).st_blocks * 512
    return total


def _children_rss(pid: int) -> int:
    """Peak RSS of ``pid`` and of its child processes (the workers of ``--workers``)."""
    total = peak_rss(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            total += _children_rss(int(child))
    return total


# ---------------------------------------------------------------------------- models


def build(name: str) -> tuple[Any, tuple[Any, ...], Any]:
    """(eager model, example inputs, dynamic shapes) of an ExecuTorch example model, of
    ``llama2`` (ExecuTorch's example, 206M parameters) or of ``HUGE``."""
    import torch

    torch.manual_seed(0)
    if name == HUGE:
        # Five weights of 8192 x 14336 float32: 2.19 GiB of tensors.
        layers: list[torch.nn.Module] = []
        for i in range(5):
            wide = i % 2 == 0
            layers += [torch.nn.Linear(8192 if wide else 14336, 14336 if wide else 8192,
                                       bias=False), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1]).eval(), (torch.randn(1, 8192),), None
    from executorch.examples.models import MODEL_NAME_TO_MODEL
    from executorch.examples.models.model_factory import EagerModelFactory

    model, inputs, _, dynamic_shapes = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL[name])
    return model.eval(), inputs, dynamic_shapes


def export(name: str) -> Any:
    import torch

    model, inputs, dynamic_shapes = build(name)
    with torch.no_grad():
        return torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True)


def unique_tensor_bytes(ep: Any) -> int:
    seen: dict[tuple[int, int], int] = {}
    for t in [*ep.state_dict.values(), *ep.constants.values()]:
        s = t.untyped_storage()
        seen[(s.data_ptr(), s.nbytes())] = s.nbytes()
    return sum(seen.values())


# ---------------------------------------------------------------------------- one model


class ByteCounter:
    """A client interceptor summing the protobuf sizes of the messages sent and received."""

    def __init__(self) -> None:
        import grpc

        self.sent = 0
        self.received = 0
        counter = self

        class Interceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor,
                          grpc.UnaryStreamClientInterceptor):
            def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
                counter.sent += request.ByteSize()
                call = continuation(details, request)
                with contextlib.suppress(Exception):
                    counter.received += call.result().ByteSize()
                return call

            def intercept_stream_unary(self, continuation: Any, details: Any,
                                       requests: Any) -> Any:
                def counted() -> Iterator[Any]:
                    for r in requests:
                        counter.sent += r.ByteSize()
                        yield r

                call = continuation(details, counted())
                with contextlib.suppress(Exception):
                    counter.received += call.result().ByteSize()
                return call

            def intercept_unary_stream(self, continuation: Any, details: Any,
                                       request: Any) -> Any:
                counter.sent += request.ByteSize()

                def counted() -> Iterator[Any]:
                    for r in continuation(details, request):
                        counter.received += r.ByteSize()
                        yield r

                return counted()

        self.interceptor = Interceptor()


def _timed(partitioner: Any) -> dict[str, list[float]]:
    """Wrap ``partitioner``'s hooks to record each call's wall time."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for hook in HOOKS:
        method = getattr(partitioner, hook)

        def wrapper(*args: Any, _m: Any = method, _h: str = hook, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return _m(*args, **kwargs)
            finally:
                times[_h].append(time.perf_counter() - t)

        setattr(partitioner, hook, wrapper)
    return times


def _lower(ep: Any, partitioner: Any, clock: measure.CpuClock | None = None) -> dict[str, Any]:
    """Lower ``ep`` to a .pte: wall seconds, SHA-256 and size of the .pte, and per phase
    (``to_edge_transform_and_lower``, ``to_executorch``) the wall, client CPU and server CPU
    seconds (the server's from ``clock``'s pid; nan without)."""
    from executorch.exir import to_edge_transform_and_lower

    clock = clock or measure.CpuClock(None)
    a = clock.read()
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    b = clock.read()
    pte = edge.to_executorch().buffer
    c = clock.read()
    phases = {PHASES[0]: measure.span(a, b), PHASES[1]: measure.span(b, c)}
    return {"wall_s": c[0] - a[0], "pte_sha256": hashlib.sha256(pte).hexdigest(),
            "pte_bytes": len(pte), "phases": phases, **_totals(phases)}


def _totals(phases: dict[str, dict[str, float]]) -> dict[str, float]:
    return {k: sum(p[k] for p in phases.values()) for k in ("client_cpu_s", "server_cpu_s")}


def _warm_up(target: str, preprocess_target: str | None = None) -> None:
    """Pay the process's one-time costs (imports, operator registration) with a small
    lowering of each kind, so that neither side of a comparison pays them. (A model of its
    own, so that no measured model is seen by the server before its cold run.)

    The preprocess server gets one too: XNNPACK's preprocess draws from the generator on its
    first call in a process only (lazily built patterns), so a fresh server's first
    ``Preprocess`` hands back a generator state moved on, and every request after it, whose
    key includes the caller's state, would be another request than the cold run's."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from remote_partitioner.client import RemotePartitioner

    small = torch.export.export(torch.nn.Linear(3, 5).eval(), (torch.randn(1, 3),), strict=True)
    _lower(small, XnnpackPartitioner())
    _lower(small, RemotePartitioner(target, "xnnpack"))
    if preprocess_target is not None:
        _lower(small, RemotePartitioner(preprocess_target, "xnnpack", remote_preprocess=True))


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class Runner:
    """The runs of one client process against one server (``target``, process ``server_pid``),
    each lowering ``ep`` and timing its phases."""

    def __init__(self, ep: Any, name: str, target: str, server_pid: int | None) -> None:
        self.ep, self.name, self.target = ep, name, target
        self.clock = measure.CpuClock(server_pid)

    def local(self) -> dict[str, Any]:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        local = XnnpackPartitioner()
        hooks = _timed(local)
        out = _lower(self.ep, local, self.clock)
        out["hooks_s"] = dict(hooks)
        _progress(f"  {self.name} local: {out['wall_s']:.2f} s")
        return out

    def remote(self, label: str, *, preprocess: bool = False,
               target: str | None = None, clock: measure.CpuClock | None = None
               ) -> dict[str, Any]:
        """One lowering with a new ``RemotePartitioner`` (new channel, new client state)."""
        import grpc

        from remote_partitioner.client import RemotePartitioner
        from remote_partitioner.client.channel import open_channel

        target = target or self.target
        counter = ByteCounter()
        channel = grpc.intercept_channel(open_channel(target), counter.interceptor)
        remote = RemotePartitioner(target, "xnnpack", channel=channel,
                                   remote_preprocess=preprocess)
        hooks = _timed(remote)
        out = _lower(self.ep, remote, clock or self.clock)
        channel.close()
        out.update({"hooks_s": dict(hooks), "sent_bytes": counter.sent,
                    "received_bytes": counter.received, "stats": dict(remote.stats)})
        _progress(f"  {self.name} {label}: {out['wall_s']:.2f} s, sent "
                  f"{counter.sent / 1e6:.2f} MB")
        return out


def _samples(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A run kind's runs: the fastest as the figure, with min and median wall time and every
    sample."""
    best = dict(min(runs, key=lambda r: r["wall_s"]))
    walls = [r["wall_s"] for r in runs]
    best.update({"min_s": min(walls), "median_s": measure.median(walls), "samples_s": walls,
                 "median_phases": {
                     ph: {k: measure.median([r["phases"][ph][k] for r in runs])
                          for k in ("wall_s", "client_cpu_s", "server_cpu_s")}
                     for ph in PHASES}})
    return best


def run_model(
    name: str, target: str, repeat: int, server_pid: int | None = None,
    preprocess_target: str | None = None, preprocess_pid: int | None = None,
) -> dict[str, Any]:
    """Local, remote cold and remote warm lowering of ``name`` against the server at
    ``target`` (local and warm ``repeat`` times each, alternating), and with
    ``preprocess_target`` (another fresh server) a cold lowering whose preprocess runs on the
    server too, then ``repeat`` warm ones; the figures as a dict."""
    _warm_up(target, preprocess_target)
    t = time.perf_counter()
    ep = export(name)
    export_s = time.perf_counter() - t
    out: dict[str, Any] = {
        "model": name,
        "export_s": export_s,
        "tensor_bytes": unique_tensor_bytes(ep),
        "runs": {},
    }
    run = Runner(ep, name, target, server_pid)
    # Wall times on a shared 2-core machine vary by 10-40 % from run to run: local and warm
    # runs alternate, and the fastest and the median of each are reported (all are kept).
    # The cold run is the first remote lowering the new server sees, once.
    local = [run.local()]
    cold = run.remote("remote cold")
    warm: list[dict[str, Any]] = []
    for _ in range(repeat):
        warm.append(run.remote("remote warm"))
        if len(local) < repeat:
            local.append(run.local())
    reference = local[0]["pte_sha256"]
    everything = [*local, cold, *warm]
    out["runs"] = {"local": _samples(local), "remote_cold": _samples([cold]),
                   "remote_warm": _samples(warm)}
    if preprocess_target is not None:
        # Preprocess on the server too (remote_preprocess=True), first on a server that has
        # not seen the model (the weights cross once for the hooks and preprocess together),
        # then again on the same server, which holds the weights and the results.
        pclock = measure.CpuClock(preprocess_pid)
        pcold = run.remote("remote preprocess cold", preprocess=True,
                           target=preprocess_target, clock=pclock)
        pwarm = []
        for _ in range(repeat):
            pwarm.append(run.remote("remote preprocess warm", preprocess=True,
                                    target=preprocess_target, clock=pclock))
        out["runs"]["remote_preprocess"] = _samples([pcold])
        out["runs"]["remote_preprocess_warm"] = _samples(pwarm)
        everything += [pcold, *pwarm]
    for r in everything:
        r["identical"] = r["pte_sha256"] == reference
    for r in out["runs"].values():
        r["identical"] = r["pte_sha256"] == reference
    out["samples_s"] = {k: r["samples_s"] for k, r in out["runs"].items()}
    out["all_identical"] = all(r["identical"] for r in everything)
    out["client_peak_rss"] = peak_rss()
    return out


def remote_only(name: str, target: str, server_pid: int, runs: int,
                pause_after: int = 0) -> dict[str, Any]:
    """``runs`` remote lowerings of ``name`` (each a new ``RemotePartitioner``) against
    ``target``, and one local one for the reference digest (the restart case). After
    ``pause_after`` of them, print ``PAUSE`` and read ``TARGET PID`` from standard input: the
    server to use from then on (the same process keeps the same program and client state)."""
    _warm_up(target)
    run = Runner(export(name), name, target, server_pid)
    remote = []
    for i in range(runs):
        if pause_after and i == pause_after:
            print("PAUSE", flush=True)
            new_target, pid = sys.stdin.readline().split()
            run.target, run.clock = new_target, measure.CpuClock(int(pid))
        remote.append(run.remote(f"remote {i + 1}"))
    reference = run.local()["pte_sha256"]
    return {"model": name, "runs": remote,
            "all_identical": all(r["pte_sha256"] == reference for r in remote)}


def make_archive(name: str, path: str, server_pid: int | None) -> dict[str, Any]:
    """``torch.export.save`` of ``name`` to ``path`` unless it exists (and of three small
    models to ``small0.pt2``... beside it), then one local lowering of the archive as read back
    (``torch.export.load``, timed apart): what the server's ``Lower`` does with it."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    out: dict[str, Any] = {"model": name}
    if not Path(path).exists():
        t = time.perf_counter()
        ep = export(name)
        out["export_s"] = time.perf_counter() - t
        out["tensor_bytes"] = unique_tensor_bytes(ep)
        t = time.perf_counter()
        torch.export.save(ep, path)
        out["save_s"] = time.perf_counter() - t
        del ep
    small = torch.export.export(torch.nn.Linear(3, 5).eval(), (torch.randn(1, 3),), strict=True)
    _lower(small, XnnpackPartitioner())
    for i in range(3):  # each new server's warm-up (lower_case): its own, so that none hits
        small_path = Path(path).with_name(f"small{i}.pt2")
        if not small_path.exists():
            torch.manual_seed(i)
            torch.export.save(torch.export.export(torch.nn.Linear(3, 5).eval(),
                                                  (torch.randn(1, 3),), strict=True),
                              str(small_path))
    clock = measure.CpuClock(server_pid)
    a = clock.read()
    ep = torch.export.load(path)
    load = measure.span(a, clock.read())
    result = _lower(ep, XnnpackPartitioner(), clock)
    result["phases"] = {"torch.export.load": load, **result["phases"]}
    result["wall_s"] += load["wall_s"]
    result.update(_totals(result["phases"]))
    out["run"] = result
    out["archive_bytes"] = Path(path).stat().st_size
    _progress(f"  {name} local (load + lower): {result['wall_s']:.2f} s")
    return out


# ---------------------------------------------------------------------------- throughput


def throughput(workers: int, clients: int, seconds: float, model: str) -> dict[str, Any]:
    """Partition calls per second on a server with ``workers`` processes (result cache off),
    ``clients`` concurrent clients each on its own connection, for ``seconds``."""
    import grpc
    from executorch.exir import to_edge
    from executorch.exir.program._fake_program import get_fake_program

    from remote_partitioner.client import RemotePartitioner
    from remote_partitioner.proto import codec
    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    program = get_fake_program(to_edge(export(model)).exported_program())
    encoded = codec.encode_program(program)
    request = pb.PartitionRequest(partitioner=pb.PartitionerRef(name="xnnpack"),
                                  program=encoded.message)
    # Not pinned: the workers and the client threads share both CPUs.
    with tempfile.TemporaryDirectory() as blobs, measure.unpinned(PIN["on"]), server(
        "--workers", str(workers), "--result-cache-bytes", "0", "--blob-dir", blobs,
        "--max-concurrent", "64", pinned=False,
    ) as (proc, target):
        RemotePartitioner(target, "xnnpack").partition(program)  # uploads the blobs
        options = [("grpc.use_local_subchannel_pool", 1),
                   ("grpc.max_send_message_length", 64 << 20)]
        done = [0] * clients
        errors: list[str] = []
        start = threading.Barrier(clients + 1)
        stop_at = [0.0]

        def client(i: int) -> None:
            with grpc.insecure_channel(target, options=options) as channel:
                stub = pb_grpc.RemotePartitionerStub(channel)
                stub.Partition(request, timeout=300)  # connect and warm up
                start.wait()
                while time.monotonic() < stop_at[0]:
                    try:
                        stub.Partition(request, timeout=300)
                        done[i] += 1
                    except grpc.RpcError as e:
                        errors.append(str(e.code()))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        stop_at[0] = time.monotonic() + 3600
        start.wait()
        t0 = time.monotonic()
        stop_at[0] = t0 + seconds
        for t in threads:
            t.join(seconds + 600)
        elapsed = time.monotonic() - t0
        return {"workers": workers, "clients": clients, "calls": sum(done),
                "per_client": done, "seconds": elapsed, "calls_per_s": sum(done) / elapsed,
                "errors": errors, "server_peak_rss": _children_rss(proc.pid)}


# ---------------------------------------------------------------------------- report


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _mm(run: dict[str, Any]) -> str:
    """A run's wall time as 'min (median)' seconds."""
    return f"{run.get('min_s', run['wall_s']):.2f} ({run.get('median_s', run['wall_s']):.2f})"


def _rate(results: dict[str, Any]) -> float:
    """The loopback rate of the floors: the fastest transfer, at the start or the end."""
    return float(max(results[k]["bytes_per_s"] for k in ("loopback", "loopback_end")
                     if k in results))


def _cpu(run: dict[str, Any]) -> float:
    """A run's CPU seconds, client process + server process."""
    return float(run["client_cpu_s"] + run["server_cpu_s"])


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of issue 35 that this run measured: per case the goal, the measured figure
    (fastest runs; medians beside), the floor (seconds the bytes that must cross take at the
    measured loopback rate) and whether the goal is met (None: nothing to compare)."""
    rate = _rate(results)
    rows: list[dict[str, Any]] = []

    def row(case: str, goal: str, measured: str, floor_bytes: float, met: bool | None,
            cpu: tuple[float, float] | None = None, **figures: float) -> None:
        # cpu: (remote, local) CPU seconds, client + server: what the machine's other jobs
        # do not inflate, beside the wall times they do.
        extra = ({"cpu_s": cpu[0], "local_cpu_s": cpu[1], "cpu_ratio": _ratio(*cpu)}
                 if cpu else {})
        rows.append({"case": case, "target": goal, "measured": measured,
                     "floor_bytes": floor_bytes, "floor_s": floor_bytes / rate, "met": met,
                     **extra, **figures})

    low = results.get("lower")
    if low:
        r = low["runs"]
        local, a, p = r["local"]["wall_s"], low["archive_bytes"], r["local"]["pte_bytes"]
        goal_s = 1.10 * (local + a / rate)
        row(f"Lower of {low['model']}'s archive, cold (CLI process start included)",
            f"<= 1.10 x (local {local:.2f} s + archive {a / 1e6:.1f} MB at the loopback rate) "
            f"= {goal_s:.2f} s", f"{r['cold']['wall_s']:.2f} s", a + p,
            r["cold"]["wall_s"] <= goal_s, (_cpu(r["cold"]), _cpu(r["local"])),
            seconds=r["cold"]["wall_s"], goal_s=goal_s)
        for key, what in (("replica", "a replica sharing the store"),
                          ("again", "the same server"),
                          ("held", "the same server, OUT.pte holding it")):
            if key not in r:
                continue  # (figures of an older bench)
            row(f"Lower of {low['model']}'s archive again ({what})",
                f"<= 0.05 x local = {0.05 * local:.2f} s",
                f"{_mm(r[key])} s = {_ratio(r[key]['wall_s'], local):.3f}x",
                0 if key == "held" else p,
                r[key]["wall_s"] <= 0.05 * local, (_cpu(r[key]), _cpu(r["local"])),
                seconds=r[key]["wall_s"],
                ratio=_ratio(r[key]["wall_s"], local))
        row(f"Lower of {low['model']}'s archive, server restarted on --blob-dir",
            "hits, as again (<= 0.05 x local)",
            f"{r['restart']['wall_s']:.2f} s = {_ratio(r['restart']['wall_s'], local):.3f}x", p,
            r["restart"]["wall_s"] <= 0.05 * local, (_cpu(r["restart"]), _cpu(r["local"])),
            seconds=r["restart"]["wall_s"])
    by_name = {m["model"]: m for m in results.get("models", [])}
    llama = by_name.get(LLAMA)
    if llama:
        r, t = llama["runs"], llama["tensor_bytes"]
        local = r["local"]["wall_s"]
        if "remote_preprocess_warm" in r:
            w = r["remote_preprocess_warm"]
            back = w["stats"]["processed_bytes"] + w["stats"]["bytes_read"]
            row("llama2 with remote preprocess, warm", f"<= 0.7 x local ({local:.2f} s)",
                f"{_mm(w)} s = {_ratio(w['wall_s'], local):.3f}x", back,
                w["wall_s"] <= 0.7 * local, (_cpu(w), _cpu(r["local"])),
                ratio=_ratio(w["wall_s"], local))
        if "remote_preprocess" in r:
            c = r["remote_preprocess"]
            goal_s = 1.10 * (local + t / rate)
            need = t + c["stats"]["graph_bytes_uploaded"] + c["stats"]["processed_bytes"]
            row("llama2 with remote preprocess, cold",
                f"<= 1.10 x (local {local:.2f} s + weights {t / 1e6:.1f} MB at the loopback "
                f"rate) = {goal_s:.2f} s", f"{c['wall_s']:.2f} s", need,
                c["wall_s"] <= goal_s, (_cpu(c), _cpu(r["local"])), seconds=c["wall_s"],
                goal_s=goal_s)
    examples = [m for m in results.get("models", []) if m["model"] in EXAMPLE_MODELS]
    if examples:
        local = sum(m["runs"]["local"]["wall_s"] for m in examples)
        warm = sum(m["runs"]["remote_warm"]["wall_s"] for m in examples)
        local_med = sum(m["runs"]["local"]["median_s"] for m in examples)
        warm_med = sum(m["runs"]["remote_warm"]["median_s"] for m in examples)
        sent = sum(m["runs"]["remote_warm"]["sent_bytes"] for m in examples)
        row(f"warm example models ({len(examples)}), remote partition only, summed",
            "<= 1.05 x local", f"{warm:.2f} / {local:.2f} s = {_ratio(warm, local):.3f}x "
            f"(medians {_ratio(warm_med, local_med):.3f}x)", sent,
            _ratio(warm, local) <= 1.05,
            (sum(_cpu(m["runs"]["remote_warm"]) for m in examples),
             sum(_cpu(m["runs"]["local"]) for m in examples)), ratio=_ratio(warm, local),
            median_ratio=_ratio(warm_med, local_med))
    if llama:
        r, t = llama["runs"], llama["tensor_bytes"]
        c = r["remote_cold"]
        weights = c["stats"].get("tensor_bytes_uploaded", 0)
        ratio = _ratio(c["wall_s"], r["local"]["wall_s"])
        row("cold llama2, remote partition only", "<= 1.05 x local, weight bytes sent <= 1 %",
            f"{ratio:.3f}x ({c['wall_s']:.2f} / {r['local']['wall_s']:.2f} s), weights "
            f"{_ratio(weights, t) * 100:.2f} %", c["stats"]["graph_bytes_uploaded"],
            ratio <= 1.05 and weights <= 0.01 * t, (_cpu(c), _cpu(r["local"])), ratio=ratio,
            weight_share=_ratio(weights, t))
    rs = results.get("restart")
    if rs:
        ratio = _ratio(rs["restarted"]["wall_s"], rs["warm"]["wall_s"])
        row(f"server restarted with --blob-dir, same lowering ({rs['model']}, partition)",
            "hits (nothing uploaded), as warm (<= 1.05 x the warm lowering after it)",
            f"{'hit' if rs['hit'] else 'MISS'}: uploaded "
            f"{rs['restarted']['stats']['bytes_uploaded'] / 1e6:.2f} MB; "
            f"{rs['restarted']['wall_s']:.2f} s vs warm {rs['warm']['wall_s']:.2f} s "
            f"({ratio:.3f}x; cold {rs['cold']['wall_s']:.2f} s)",
            rs["restarted"]["sent_bytes"], rs["hit"] and ratio <= 1.05,
            (_cpu(rs["restarted"]), _cpu(rs["warm"])), ratio=ratio)
    return rows


def _phase_lines(results: dict[str, Any]) -> list[str]:
    """Wall and CPU seconds side by side, per phase, for every run (the fastest of its kind)."""
    lines = [f"{'model':<18}{'run':<24}{'wall min':>9}{'median':>8}  "
             + "  ".join(f"{ph + ': wall / client CPU / server CPU':<54}" for ph in PHASES)]
    for m in results.get("models", []):
        for run, r in m["runs"].items():
            cells = [f"{r['phases'][ph]['wall_s']:>8.2f} / {r['phases'][ph]['client_cpu_s']:>6.2f}"
                     f" / {r['phases'][ph]['server_cpu_s']:>6.2f}" for ph in PHASES]
            lines.append(f"{m['model']:<18}{run:<24}{r.get('min_s', r['wall_s']):>9.2f}"
                         f"{r.get('median_s', r['wall_s']):>8.2f}  "
                         + "  ".join(f"{c:<54}" for c in cells))
    low = results.get("lower")
    if low:
        r = low["runs"]["local"]
        load = r["phases"]["torch.export.load"]
        lines.append(f"{low['model']:<18}{'local (archive)':<24}{_mm(r):>17}  "
                     f"load {load['wall_s']:.2f} s, then as above: "
                     + "  ".join(f"{r['phases'][ph]['wall_s']:.2f} / "
                                 f"{r['phases'][ph]['client_cpu_s']:.2f} / "
                                 f"{r['phases'][ph]['server_cpu_s']:.2f}" for ph in PHASES))
        for key in ("cold", "again", "held", "replica", "restart"):
            if key not in low["runs"]:
                continue  # (figures of an older bench)
            x = low["runs"][key]
            lines.append(f"{low['model']:<18}{'Lower CLI ' + key:<24}{_mm(x):>17}  "
                         f"whole command (both phases on the server): client CPU "
                         f"{x['client_cpu_s']:.2f} s, server CPU {x['server_cpu_s']:.2f} s")
    rs = results.get("restart")
    if rs:
        for key in ("cold", "restarted", "warm"):
            x = rs[key]
            lines.append(f"{rs['model']:<18}{'restart: ' + key:<24}{x['wall_s']:>9.2f}{'':>8}  "
                         + "  ".join(
                             f"{x['phases'][ph]['wall_s']:>8.2f} / "
                             f"{x['phases'][ph]['client_cpu_s']:>6.2f} / "
                             f"{x['phases'][ph]['server_cpu_s']:>6.2f}{'':<30}" for ph in PHASES))
    return lines


def report(results: dict[str, Any]) -> str:
    lines = []
    lo, end = results["loopback"], results.get("loopback_end", results["loopback"])
    lines.append(f"loopback rate ({lo['method']}): at the start {lo['bytes_per_s'] / 1e9:.2f} "
                 f"GB/s fastest, {lo['median_bytes_per_s'] / 1e9:.2f} median; at the end "
                 f"{end['bytes_per_s'] / 1e9:.2f} fastest, {end['median_bytes_per_s'] / 1e9:.2f}"
                 " median; " + ("servers on CPU 1, clients on CPU 0" if results["pinned"]
                                else "not pinned"))
    if results.get("models"):
        lines.append("")
        lines.append(
            f"{'model':<18}{'tensors MB':>11}{'local s':>9}{'cold s':>8}{'warm s':>8}"
            f"{'cold x':>8}{'warm x':>8}{'sent MB':>9}{'weights MB':>11}{'again MB':>9}"
            f"{'srv RSS MB':>11}{'cli RSS MB':>11}  same")
    for m in results.get("models", []):
        r = m["runs"]
        local, cold, warm = r["local"]["wall_s"], r["remote_cold"]["wall_s"], r["remote_warm"][
            "wall_s"]
        lines.append(
            f"{m['model']:<18}{m['tensor_bytes'] / 1e6:>11.1f}{local:>9.2f}{cold:>8.2f}"
            f"{warm:>8.2f}{_ratio(cold, local):>8.3f}{_ratio(warm, local):>8.3f}"
            f"{r['remote_cold']['sent_bytes'] / 1e6:>9.2f}"
            f"{r['remote_cold']['stats'].get('tensor_bytes_uploaded', 0) / 1e6:>11.2f}"
            f"{r['remote_warm']['sent_bytes'] / 1e6:>9.3f}"
            f"{m['server_peak_rss'] / 1e6:>11.0f}{m['client_peak_rss'] / 1e6:>11.0f}  "
            f"{'yes' if m['all_identical'] else 'NO'}"
        )
    lines.append("")
    lines.append("wall seconds, min and median over the runs; per phase of the fastest run: "
                 "wall / client process CPU / server process CPU (s)")
    lines += _phase_lines(results)
    for m in results.get("models", []):
        p = m["runs"].get("remote_preprocess")
        if p is None:
            continue
        st = p["stats"]
        lines.append(
            f"{m['model']}, preprocess on the server, cold: weights uploaded "
            f"{st.get('tensor_bytes_uploaded', 0) / 1e6:.2f} MB; wire "
            f"{(p['sent_bytes'] + p['received_bytes']) / 1e6:.2f} MB "
            f"({p['sent_bytes'] / 1e6:.2f} sent, {p['received_bytes'] / 1e6:.2f} received); "
            f"identical {p['identical']}")
    for m in results.get("models", []):
        r = m["runs"]
        graph = r["remote_cold"]["stats"]["graph_bytes_uploaded"]
        lines.append(
            f"{m['model']}: wire {r['remote_cold']['sent_bytes'] / 1e6:.2f} MB sent for "
            f"{m['tensor_bytes'] / 1e6:.2f} MB of tensors + {graph / 1e6:.2f} MB of graphs; "
            f"again {r['remote_warm']['sent_bytes'] / 1e6:.3f} MB")
    low, rs = results.get("lower"), results.get("restart")
    if low:
        lines.append(f"Lower of {low['model']}: archive {low['archive_bytes'] / 1e6:.2f} MB, "
                     f".pte {low['runs']['local']['pte_bytes'] / 1e6:.2f} MB; server metrics, "
                     f"cold: {low['runs']['cold']['metrics']}; after the restart: "
                     f"{low['runs']['restart']['metrics']}; identical {low['all_identical']}")
    if rs:
        lines.append(f"restart ({rs['model']}): server metrics before: {rs['before_metrics']}"
                     f"; after: {rs['after_metrics']}; identical {rs['all_identical']}")
    examples = [m for m in results.get("models", []) if m["model"] in EXAMPLE_MODELS]
    if examples:
        s = results["summary"]
        lines.append("")
        lines.append("per-hook wall time, summed over the example models (local / cold / warm s):")
        for hook in HOOKS:
            lines.append(f"  {hook:<34}" + " / ".join(
                f"{s['hooks'][run].get(hook, 0.0):.3f}" for run in ("local", "remote_cold",
                                                                     "remote_warm")))
    if results.get("throughput"):
        lines.append("")
        for t in results["throughput"]:
            lines.append(f"throughput, {t['workers']} worker(s), {t['clients']} clients: "
                         f"{t['calls_per_s']:.2f} partition calls/s ({t['calls']} in "
                         f"{t['seconds']:.1f} s, {len(t['errors'])} errors)")
        if len(results["throughput"]) == 2:
            one, two = results["throughput"]
            speedup = _ratio(two["calls_per_s"], one["calls_per_s"])
            lines.append(f"2 workers / 1 worker: {speedup:.2f}x (target >= 1.7)")
    lines.append("")
    lines.append(f"targets (issue 35); floor: the bytes that must cross at "
                 f"{_rate(results) / 1e9:.2f} GB/s")
    for t in results["targets"]:
        verdict = {True: "met", False: "NOT MET", None: "-"}[t["met"]]
        cpu = (f"\n      CPU, client + server: {t['cpu_s']:.2f} s vs {t['local_cpu_s']:.2f} s "
               f"({t['cpu_ratio']:.3f}x)" if "cpu_s" in t else "")
        lines.append(f"  {t['case']}\n      target {t['target']}\n      measured "
                     f"{t['measured']}; floor {t['floor_s']:.3f} s "
                     f"({t['floor_bytes'] / 1e6:.2f} MB); {verdict}{cpu}")
    return "\n".join(lines)


def summarize(models: list[dict[str, Any]]) -> dict[str, Any]:
    examples = [m for m in models if m["model"] in EXAMPLE_MODELS]
    total = {run: sum(m["runs"][run]["wall_s"] for m in examples)
             for run in ("local", "remote_cold", "remote_warm")}
    hooks: dict[str, dict[str, float]] = {}
    for run in ("local", "remote_cold", "remote_warm"):
        hooks[run] = {h: sum(sum(m["runs"][run]["hooks_s"].get(h, [])) for m in examples)
                      for h in HOOKS}
    return {
        "examples_local_s": total["local"],
        "examples_cold_s": total["remote_cold"],
        "examples_warm_s": total["remote_warm"],
        "examples_cold_ratio": _ratio(total["remote_cold"], total["local"]),
        "examples_warm_ratio": _ratio(total["remote_warm"], total["local"]),
        "hooks": hooks,
        "all_identical": all(m["all_identical"] for m in models),
    }


def _run_child(args: list[str], what: str,
               pause: Callable[[], str] | None = None) -> dict[str, Any]:
    """This script in a child process (a client, on the client CPU when pinned: it inherits
    this process's placement) with ``args``; its ``[bench]`` progress lines pass through; its
    last stdout line, JSON, is the result. When it prints ``PAUSE``, ``pause()`` runs and its
    answer is sent to the child's standard input."""
    tail: collections.deque[str] = collections.deque(maxlen=200)
    child = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if pause else subprocess.DEVNULL,
        text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert child.stderr is not None and child.stdout is not None

    def relay() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            tail.append(line)
            if line.startswith("[bench]"):
                print(line, end="", file=sys.stderr, flush=True)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    last = ""
    for line in child.stdout:
        if line.strip() == "PAUSE" and pause is not None and child.stdin is not None:
            child.stdin.write(pause() + "\n")
            child.stdin.flush()
        elif line.strip():
            last = line
    child.wait()
    relay_thread.join(60)
    if child.returncode != 0:
        print("".join(tail)[-4000:], file=sys.stderr)
        raise SystemExit(f"[bench] {what} failed")
    result: dict[str, Any] = json.loads(last)
    return result


def _model_round(name: str, repeat: int, preprocess: bool) -> dict[str, Any]:
    """One child process lowering ``name`` against fresh servers (see :func:`run_model`);
    with ``preprocess``, also with preprocess on a second fresh server."""
    with served() as srv, contextlib.ExitStack() as more:
        extra: list[str] = []
        if preprocess:
            pre = more.enter_context(served())
            extra = ["--preprocess-target", pre.target, "--preprocess-pid", str(pre.pid)]
        result = _run_child(
            ["--one", name, "--target", srv.target, "--server-pid", str(srv.pid),
             "--repeat", str(repeat), *extra], name)
        result["server_peak_rss"] = peak_rss(srv.pid)
    return result


def _fastest(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's rounds as one result: each run (local, cold, warm, preprocess) from the
    round where it was fastest, min and median over every round's samples, the highest peak
    RSS, and identical only if every round was."""
    if len(rounds) == 1:
        return rounds[0]
    out = dict(rounds[0])
    out["runs"] = {}
    for run in rounds[0]["runs"]:
        best = dict(min((r["runs"][run] for r in rounds), key=lambda x: x["wall_s"]))
        samples = [x for r in rounds for x in r["runs"][run]["samples_s"]]
        best.update({"samples_s": samples, "min_s": min(samples),
                     "median_s": measure.median(samples)})
        out["runs"][run] = best
    out["samples_s"] = {k: r["samples_s"] for k, r in out["runs"].items()}
    out["all_identical"] = all(r["all_identical"] for r in rounds)
    out["server_peak_rss"] = max(r["server_peak_rss"] for r in rounds)
    out["client_peak_rss"] = max(r["client_peak_rss"] for r in rounds)
    out["rounds"] = len(rounds)
    return out


def _cli_lower(path: str, srv: Server, label: str, keep: bool = False) -> dict[str, Any]:
    """``remote-partitioner lower PATH --partitioner xnnpack -o OUT.pte`` in a new process
    (its start, imports and the upload included) against ``srv``: wall time from spawn to
    exit, the client's CPU (the child's rusage) and the server's (``/proc``), the server's
    metric changes (bytes, cache hits), and the ``.pte``'s digest. ``OUT.pte`` is named after
    ``label``, and removed after unless ``keep`` (a later run with that label finds it: the
    command line then downloads nothing)."""
    out_path = str(Path(path).with_suffix(f".{label.replace(' ', '_')}.pte"))
    m0, s0 = srv.metrics(), measure.tree_cpu_seconds(srv.pid)
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "remote_partitioner.cli", "lower", path,
             "--partitioner", "xnnpack", "-o", out_path, "--target", srv.target, "--json"],
            stdout=so, stderr=se, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        s1, m1 = measure.tree_cpu_seconds(srv.pid), srv.metrics()
        so.seek(0)
        se.seek(0)
        if proc.returncode != 0:
            print(se.read().decode(errors="replace")[-4000:], file=sys.stderr)
            raise SystemExit(f"[bench] remote-partitioner lower ({label}) failed")
        printed = json.loads(so.read())
    if not keep:
        Path(out_path).unlink(missing_ok=True)
    result = {"wall_s": wall, "client_cpu_s": usage.ru_utime + usage.ru_stime,
              "server_cpu_s": s1 - s0, "pte_sha256": printed["output"]["sha256"],
              "pte_bytes": printed["output"]["bytes"], "metrics": measure.delta(m0, m1)}
    _progress(f"  Lower via the command line, {label}: {wall:.2f} s (client CPU "
              f"{result['client_cpu_s']:.2f} s, server CPU {result['server_cpu_s']:.2f} s)")
    return result


def lower_case(name: str, repeat: int) -> dict[str, Any]:
    """The ``Lower`` RPC through the command line on ``name``'s PT2 archive: cold on a
    server with a new ``--blob-dir``; again on it (``repeat`` times, alternating with local
    lowerings of the archive, each in a new client process); again into an output that
    already holds the ``.pte`` (``repeat`` times: nothing downloaded); again on a second
    server (a replica) sharing the directory; and on a server restarted on it. Each new server
    first lowers a small archive (its one-time costs: imports, operator registration), as the
    other cases' client processes do. The command lines share a digest cache of their own (the
    cold one finds it empty)."""
    with tempfile.TemporaryDirectory(prefix="bench-lower-") as tmp:
        os.environ["REMOTE_PARTITIONER_DIGEST_CACHE"] = f"{tmp}/digests"
        path, blobs = f"{tmp}/{name}.pt2", f"{tmp}/blobs"
        small = [f"{tmp}/small{i}.pt2" for i in range(3)]
        Path(blobs).mkdir()
        with served("--blob-dir", blobs, metrics=True) as a:
            archive = ["--archive", name, "--path", path, "--server-pid", str(a.pid)]
            local = [_run_child(archive, f"{name}'s archive")]
            _cli_lower(small[0], a, "server warm-up")
            cold = _cli_lower(path, a, "cold")
            again: list[dict[str, Any]] = []
            for _ in range(repeat):
                again.append(_cli_lower(path, a, "again"))
                if len(local) < repeat:
                    local.append(_run_child(archive, f"{name}'s archive"))
            _cli_lower(path, a, "output held", keep=True)  # (writes it)
            held = [_cli_lower(path, a, "output held", keep=True) for _ in range(repeat)]
            with served("--blob-dir", blobs, metrics=True) as b:
                _cli_lower(small[1], b, "replica warm-up")
                replica = _cli_lower(path, b, "again on a replica sharing --blob-dir")
        with served("--blob-dir", blobs, metrics=True) as c:
            _cli_lower(small[2], c, "restarted server warm-up")
            restarted = _cli_lower(path, c, "again after a restart on --blob-dir")
    first = local[0]
    runs = {"local": _samples([r["run"] for r in local]), "cold": cold,
            "again": _cli_samples(again), "held": _cli_samples(held), "replica": replica,
            "restart": restarted}
    reference = runs["local"]["pte_sha256"]
    everything = [*(r["run"] for r in local), cold, *again, *held, replica, restarted]
    return {"model": name, "archive_bytes": first["archive_bytes"],
            "tensor_bytes": first.get("tensor_bytes", 0), "runs": runs,
            "all_identical": all(r["pte_sha256"] == reference for r in everything)}


def _cli_samples(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(min(runs, key=lambda r: r["wall_s"]))
    walls = [r["wall_s"] for r in runs]
    best.update({"min_s": min(walls), "median_s": measure.median(walls), "samples_s": walls})
    return best


def restart_case(name: str) -> dict[str, Any]:
    """One client process lowers ``name`` on a server with ``--blob-dir``; the server stops
    and a new one starts on the same directory; the same client process lowers it again twice
    (after the restart, then warm). Hits: nothing uploaded after the restart; the servers'
    metric changes are kept. (The same client process: a new one encodes the same model's
    graphs to other bytes today, see bench/README.md.)"""
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp, \
            contextlib.ExitStack() as later:
        out: dict[str, Any] = {"model": name}
        first = contextlib.ExitStack()
        a = first.enter_context(served("--blob-dir", tmp, metrics=True))
        m0 = a.metrics()
        servers: list[Server] = []

        def restart() -> str:
            out["before_metrics"] = measure.delta(m0, a.metrics())
            first.close()
            _progress("  server stopped; a new one starts on the same --blob-dir")
            b = later.enter_context(served("--blob-dir", tmp, metrics=True))
            servers.append(b)
            out["m1"] = b.metrics()
            return f"{b.target} {b.pid}"

        try:
            got = _run_child(["--remote-only", "3", "--pause-after", "1", "--one", name,
                              "--target", a.target, "--server-pid", str(a.pid)],
                             f"{name} (restart)", pause=restart)
        finally:
            first.close()
        out["after_metrics"] = measure.delta(out.pop("m1"), servers[0].metrics())
    out["cold"], out["restarted"], out["warm"] = got["runs"]
    out["hit"] = out["restarted"]["stats"]["bytes_uploaded"] == 0
    out["all_identical"] = got["all_identical"]
    return out


# ---------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=EXAMPLE_MODELS,
                        help="example models to lower (default: the ten of the fidelity tests)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES),
                        help="which cases to run (default: all): examples (--models), llama "
                             "(partition and preprocess, cold and warm), huge, lower (the "
                             "Lower RPC via the command line), restart (--blob-dir), "
                             "throughput")
    parser.add_argument("--llama-only", action="store_true",
                        help="the llama2 cases alone: --cases llama lower restart")
    parser.add_argument("--case-model", default=LLAMA,
                        help="the model of the lower and restart cases (default llama2)")
    parser.add_argument("--with-preprocess", action="store_true",
                        help="also lower each example model with preprocess on the server "
                             "(always done for llama2)")
    parser.add_argument("--no-llama", action="store_true",
                        help="skip llama2 (206M parameters): the llama case, and the lower and "
                             "restart cases unless --case-model names another model")
    parser.add_argument("--no-huge", action="store_true", help="skip the >2 GiB model")
    parser.add_argument("--no-throughput", action="store_true", help="skip the worker figures")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin the servers to CPU 1 and the clients to CPU 0")
    parser.add_argument("--seconds", type=float, default=30.0, help="per throughput run")
    parser.add_argument("--clients", type=int, default=6, help="concurrent throughput clients")
    parser.add_argument("--repeat", type=int, default=3,
                        help="local and warm runs per example model, alternating (once for "
                             "llama2 and huge); min and median are reported")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of llama2 and huge (each its own client process and fresh "
                             "servers: local, cold, warm); each run's fastest round counts")
    parser.add_argument("--loopback-mb", type=int, default=512,
                        help="bytes sent to measure the loopback rate, in MiB")
    parser.add_argument("--json", default="build/bench.json", help="where the figures go")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: MODEL
    parser.add_argument("--remote-only", type=int, help=argparse.SUPPRESS)  # with --one
    parser.add_argument("--pause-after", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--archive", help=argparse.SUPPRESS)  # child mode: MODEL (--path)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--preprocess-target", help=argparse.SUPPRESS)
    parser.add_argument("--preprocess-pid", type=int, help=argparse.SUPPRESS)
    return parser


def _child(args: argparse.Namespace) -> int:
    if args.archive:
        print(json.dumps(make_archive(args.archive, args.path, args.server_pid)))
    elif args.remote_only:
        print(json.dumps(remote_only(args.one, args.target, args.server_pid,
                                     args.remote_only, args.pause_after)))
    else:
        repeat = 1 if args.one in (LLAMA, HUGE) else args.repeat
        print(json.dumps(run_model(args.one, args.target, repeat, args.server_pid,
                                   args.preprocess_target, args.preprocess_pid)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.one or args.archive:
        return _child(args)

    cases = set(args.cases)
    if args.llama_only:
        cases = {"llama", "lower", "restart"}
    cases -= {x for x, off in (("llama", args.no_llama), ("huge", args.no_huge),
                               ("throughput", args.no_throughput)) if off}
    if args.no_llama and args.case_model == LLAMA and not args.llama_only:
        cases -= {"lower", "restart"}  # llama2's cases too, unless --case-model says another
    PIN["on"] = not args.no_pin and measure.can_pin()
    if PIN["on"]:
        measure.pin_self(measure.CLIENT_CPU)  # every client process started from here too
    _progress(f"cases: {', '.join(c for c in CASES if c in cases)}; "
              + (f"servers on CPU {measure.SERVER_CPU}, clients on CPU {measure.CLIENT_CPU}"
                 if PIN["on"] else "not pinned"))
    results: dict[str, Any] = {"cases": sorted(cases), "pinned": PIN["on"]}
    _progress(f"loopback rate ({args.loopback_mb} MiB, 3 times) ...")
    results["loopback"] = measure.loopback_rate(args.loopback_mb << 20, pin=PIN["on"])
    _progress(f"loopback: {results['loopback']['bytes_per_s'] / 1e9:.2f} GB/s (fastest), "
              f"{results['loopback']['median_bytes_per_s'] / 1e9:.2f} GB/s (median)")

    names = [*(args.models if "examples" in cases else []),
             *([LLAMA] if "llama" in cases else []), *([HUGE] if "huge" in cases else [])]
    models = []
    for name in names:
        rounds = []
        n = args.rounds if name in (LLAMA, HUGE) else 1
        for i in range(n):
            _progress(f"{name} ..." + (f" (round {i + 1} of {n})" if n > 1 else ""))
            rounds.append(_model_round(name, args.repeat,
                                       name == LLAMA or (args.with_preprocess and name != HUGE)))
        result = _fastest(rounds)
        models.append(result)
        r = result["runs"]
        _progress(f"{name}: local {r['local']['wall_s']:.2f} s, cold "
                  f"{r['remote_cold']['wall_s']:.2f} s, warm {r['remote_warm']['wall_s']:.2f} s, "
                  f"identical {result['all_identical']}")
    results["models"] = models
    results["summary"] = summarize(models)
    if "lower" in cases:
        _progress(f"Lower of {args.case_model}'s archive via the command line ...")
        results["lower"] = lower_case(args.case_model,
                                      1 if args.case_model in (LLAMA, HUGE) else args.repeat)
    if "restart" in cases:
        _progress(f"server restarted on its --blob-dir, {args.case_model} ...")
        results["restart"] = restart_case(args.case_model)
    if "throughput" in cases:
        results["throughput"] = []
        for workers in (1, 2):
            _progress(f"throughput, {workers} worker(s) ...")
            results["throughput"].append(
                throughput(workers, args.clients, args.seconds, "mobilenet_v1_025"))
    # Again at the end: the rate moves with what else the machine runs (the faster counts).
    results["loopback_end"] = measure.loopback_rate(args.loopback_mb << 20, pin=PIN["on"])
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    results["targets"] = targets(results)
    identical = results["summary"]["all_identical"] and all(
        results[k]["all_identical"] for k in ("lower", "restart") if k in results)
    results["all_identical"] = identical
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"\nfigures written to {args.json}")
    if not identical:
        print("FIDELITY FAILURE: a remote .pte differs from the local one", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
