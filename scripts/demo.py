"""Lower a real ExecuTorch example model through a remote partitioning server, and check it.

Starts ``remote-partitioner serve`` on a free loopback port (or uses ``--target``), exports an
ExecuTorch example model, lowers it twice with ``to_edge_transform_and_lower(...)
.to_executorch()``: once with ``RemotePartitioner(target, "xnnpack")`` and once with the local
``XnnpackPartitioner()``. Prints what each delegated and what stayed on the CPU, the ``.pte``
sizes, wall times and the RemotePartitioner's stats, writes the remote ``.pte`` and exits 1 if
its bytes differ from the local one's::

    python scripts/demo.py                        # make demo
    python scripts/demo.py --model mv2 --output mv2.pte
    python scripts/demo.py --target 127.0.0.1:50051   # a server that is already running
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager
    from executorch.exir.backend.partitioner import Partitioner
    from torch.export import ExportedProgram

# torch, torchao and ExecuTorch warn loudly on import and export; none of it is about the demo.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|torchao|executorch)\b")
for _noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)

DEFAULT_MODEL = "mobilenet_v1_025"
PARTITIONER = "xnnpack"
STARTUP_SECONDS = 180.0
_LISTENING = re.compile(r" on (\S+:\d+)$")


class ServerUnavailable(Exception):
    """The server did not start, or did not report SERVING in time."""


# ---------------------------------------------------------------------------- server


def wait_serving(target: str, deadline: float) -> None:
    """Poll ``grpc.health.v1`` at ``target`` until SERVING, until ``deadline`` (monotonic)."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= deadline:
                raise ServerUnavailable(f"the server at {target} did not report SERVING in time")
            time.sleep(0.2)


def _first_line(stream: IO[str], timeout: float) -> str:
    """The first line of ``stream`` ("" at end of file); ServerUnavailable after ``timeout``."""
    lines: queue.Queue[str] = queue.Queue(maxsize=1)
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=max(timeout, 0.0))
    except queue.Empty:
        raise ServerUnavailable(f"the server printed nothing in {timeout:.0f} s") from None


def _tail(log: IO[str], chars: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-chars:]


@contextmanager
def local_server(startup_seconds: float) -> Iterator[str]:
    """Run ``remote-partitioner serve`` on a free port of 127.0.0.1; yield its target.

    The server is terminated (killed if it does not stop) when the block exits, however it
    exits.
    """
    deadline = time.monotonic() + startup_seconds
    with tempfile.TemporaryFile(mode="w+", prefix="remote-partitioner-", suffix=".log") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "remote_partitioner.cli",
                "serve",
                "--address",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        try:
            assert proc.stdout is not None
            line = _first_line(proc.stdout, deadline - time.monotonic()).strip()
            match = _LISTENING.search(line)
            if match is None:
                proc.poll()
                raise ServerUnavailable(
                    f"the server did not start (exit code {proc.returncode}, first line "
                    f"{line!r}); its stderr:\n{_tail(log)}"
                )
            target = match.group(1)
            wait_serving(target, deadline)
            print(f"server: {line} (pid {proc.pid})")
            yield target
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


# ---------------------------------------------------------------------------- lowering


@dataclass
class Delegation:
    """What a lowering delegated, per backend, and which operators stayed on the CPU."""

    calls: Counter[str] = field(default_factory=Counter)
    nodes: Counter[str] = field(default_factory=Counter)
    cpu_ops: Counter[str] = field(default_factory=Counter)


@dataclass
class Lowering:
    label: str
    pte: bytes
    lower_seconds: float
    to_executorch_seconds: float
    delegation: Delegation


def export(model_name: str) -> ExportedProgram:
    """Export the ExecuTorch example model ``model_name`` (deterministic weights per run)."""
    import torch
    from executorch.examples.models import MODEL_NAME_TO_MODEL
    from executorch.examples.models.model_factory import EagerModelFactory

    torch.manual_seed(0)
    model, inputs, kwarg_inputs, dynamic_shapes = EagerModelFactory.create_model(
        *MODEL_NAME_TO_MODEL[model_name]
    )
    return torch.export.export(
        model.eval(), inputs, kwargs=kwarg_inputs, dynamic_shapes=dynamic_shapes, strict=True
    )


def delegation(edge: EdgeProgramManager) -> Delegation:
    """Walk every method's Edge graphs: delegate calls, the nodes each delegate took, and the
    operators left outside any delegate."""
    import operator

    import torch.fx
    from executorch.exir.delegate import executorch_call_delegate

    found = Delegation()
    for method in sorted(edge.methods):
        root = edge.exported_program(method).graph_module
        for module in root.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.nodes:
                if node.op != "call_function" or node.target is operator.getitem:
                    continue
                if node.target is executorch_call_delegate:
                    lowered: Any = getattr(module, node.args[0].target)
                    found.calls[lowered.backend_id] += 1
                    found.nodes[lowered.backend_id] += sum(
                        1
                        for n in lowered.original_module.graph.nodes
                        if n.op == "call_function" and n.target is not operator.getitem
                    )
                else:
                    found.cpu_ops[str(getattr(node.target, "__name__", node.target))] += 1
    return found


def lower(label: str, ep: ExportedProgram, partitioner: Partitioner) -> Lowering:
    """``to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch()``, timed."""
    from executorch.exir import to_edge_transform_and_lower

    start = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    lowered = time.perf_counter()
    found = delegation(edge)
    serialize_start = time.perf_counter()
    pte = edge.to_executorch().buffer
    done = time.perf_counter()
    return Lowering(label, pte, lowered - start, done - serialize_start, found)


def report(result: Lowering) -> None:
    d = result.delegation
    print(f"\n== {result.label}")
    print(
        f"   to_edge_transform_and_lower {result.lower_seconds:.2f} s, "
        f"to_executorch {result.to_executorch_seconds:.2f} s, "
        f".pte {len(result.pte):,} bytes"
    )
    if not d.calls:
        print("   delegated: nothing")
    for backend, calls in sorted(d.calls.items()):
        print(
            f"   delegated to {backend}: {calls} delegate call{'s' * (calls != 1)}, "
            f"{d.nodes[backend]} operator nodes"
        )
    if d.cpu_ops:
        print(f"   left on CPU: {sum(d.cpu_ops.values())} operator nodes")
        for op, count in sorted(d.cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"      {count:4d}  {op}")
    else:
        print("   left on CPU: nothing")


def first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


# ---------------------------------------------------------------------------- main


def xnnpack_partitioner() -> Partitioner:
    """The local partitioner the remote lowering must reproduce."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def run(args: argparse.Namespace, target: str) -> int:
    # (Imported here, alone: this script runs from a checkout and needs the installed package.)
    from remote_partitioner.client import RemotePartitioner

    remote = RemotePartitioner(target, PARTITIONER)
    try:
        start = time.perf_counter()
        results = [lower(f"remote: {remote!r}", export(args.model), remote)]
        remote_stats = dict(remote.stats)
        local = xnnpack_partitioner()
        results.append(lower(f"local: {type(local).__name__}()", export(args.model), local))
        total = time.perf_counter() - start
    finally:
        remote.close()

    for result in results:
        report(result)
    print(f"\nRemotePartitioner.stats: {remote_stats}")
    print(
        f"wall time, exports and both lowerings: {total:.2f} s "
        "(the remote lowering runs first and also pays one-time warm-up)"
    )

    remote_pte, local_pte = results[0].pte, results[1].pte
    output = Path(args.output or f"{args.model}_remote.pte")
    output.write_bytes(remote_pte)
    print(f"wrote {output} ({len(remote_pte):,} bytes)")
    if remote_pte != local_pte:
        local_output = output.with_name(f"{output.stem}.local{output.suffix}")
        local_output.write_bytes(local_pte)
        print(
            f"\nFAILED: the remote .pte differs from the local one: {len(remote_pte):,} vs "
            f"{len(local_pte):,} bytes, first difference at byte "
            f"{first_difference(remote_pte, local_pte):,} (local .pte written to {local_output})",
            file=sys.stderr,
        )
        return 1
    digest = hashlib.sha256(remote_pte).hexdigest()
    print(
        f"\nEQUAL bytes: the remote and local .pte are identical "
        f"({len(remote_pte):,} bytes, sha256 {digest[:16]}...)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lower an ExecuTorch example model through a remote partitioning server "
        "and compare the .pte with a local lowering."
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"ExecuTorch example model name (default {DEFAULT_MODEL}; see "
        "executorch.examples.models.MODEL_NAME_TO_MODEL)",
    )
    parser.add_argument(
        "--target",
        metavar="HOST:PORT",
        help="use this running server instead of starting one",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="where to write the remote .pte (default MODEL_remote.pte)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=STARTUP_SECONDS,
        metavar="SECONDS",
        help=f"how long to wait for the server to report SERVING (default {STARTUP_SECONDS:.0f})",
    )
    args = parser.parse_args(argv)

    from executorch.examples.models import MODEL_NAME_TO_MODEL

    if args.model not in MODEL_NAME_TO_MODEL:
        parser.error(
            f"unknown model {args.model!r}; known: {', '.join(sorted(MODEL_NAME_TO_MODEL))}"
        )
    try:
        if args.target:
            wait_serving(args.target, time.monotonic() + args.startup_timeout)
            print(f"server: {args.target} (already running)")
            return run(args, args.target)
        with local_server(args.startup_timeout) as target:
            return run(args, target)
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
