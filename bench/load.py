"""The load benchmark: a server's partition throughput and latency while streams stall, and its
memory while many clients upload at once.

    python bench/load.py                 # part of make bench; --json PATH for the figures
    python bench/load.py --seconds 5 --stalled 0 64

Figures:

* with 0, 64 and 512 stalled upload streams (each declared 1 MiB, first KiB sent, then
  nothing): partition calls per second from 4 concurrent clients (result cache off, so every
  call runs the partitioner), their p50 and p99 latency, and the slowest health check made
  meanwhile (one every 0.1 s);
* 16 clients uploading 100 MB each at once (distinct random blobs; a refused upload waits as
  its RetryInfo says and tries again): the server's peak RSS (``VmHWM``), the bytes it holds in
  memory files (large blobs, outside the RSS), and how many uploads
  were refused, with the default in-flight bound (2 GiB) and with a 512 MiB one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from streams import MIB, StalledStreams

from bench import export, memory_file_bytes, peak_rss, server

PARTITION_CLIENTS = 4
UPLOAD_CLIENTS = 16
UPLOAD_BYTES = 100 * 1000 * 1000


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def partition_under_stalls(stalled: int, seconds: float, model: str) -> dict[str, Any]:
    """Partition calls/s and latency from concurrent clients while ``stalled`` uploads stall."""
    import grpc
    from executorch.exir import to_edge
    from executorch.exir.program._fake_program import get_fake_program
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from remote_partitioner.client import RemotePartitioner
    from remote_partitioner.proto import codec
    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    program = get_fake_program(to_edge(export(model)).exported_program())
    request = pb.PartitionRequest(partitioner=pb.PartitionerRef(name="xnnpack"),
                                  program=codec.encode_program(program).message)
    with server("--result-cache-bytes", "0") as (proc, target):
        RemotePartitioner(target, "xnnpack").partition(program)  # uploads the blobs
        latencies: list[list[float]] = [[] for _ in range(PARTITION_CLIENTS)]
        health: list[float] = []
        errors: list[str] = []
        with StalledStreams(target, stalled, "upload", blob_bytes=MIB):
            stop_at = time.monotonic() + seconds

            def client(i: int) -> None:
                with grpc.insecure_channel(
                    target, options=[("grpc.use_local_subchannel_pool", 1)]
                ) as channel:
                    stub = pb_grpc.RemotePartitionerStub(channel)
                    while time.monotonic() < stop_at:
                        t0 = time.perf_counter()
                        try:
                            stub.Partition(request, timeout=120)
                            latencies[i].append(time.perf_counter() - t0)
                        except grpc.RpcError as e:
                            errors.append(e.code().name)

            def prober() -> None:
                with grpc.insecure_channel(target) as channel:
                    stub = health_pb2_grpc.HealthStub(channel)
                    while time.monotonic() < stop_at:
                        t0 = time.perf_counter()
                        stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                        health.append(time.perf_counter() - t0)
                        time.sleep(0.1)

            threads = [threading.Thread(target=client, args=(i,))
                       for i in range(PARTITION_CLIENTS)]
            threads.append(threading.Thread(target=prober))
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(seconds + 300)
            elapsed = time.monotonic() - t0
        flat = [x for per in latencies for x in per]
        return {
            "stalled": stalled, "calls": len(flat), "seconds": elapsed,
            "calls_per_s": len(flat) / elapsed, "p50_s": _percentile(flat, 0.50),
            "p99_s": _percentile(flat, 0.99), "health_max_s": max(health, default=float("nan")),
            "errors": errors, "server_peak_rss": peak_rss(proc.pid),
        }


def concurrent_uploads(max_inflight: int | None) -> dict[str, Any]:
    """Peak server RSS while :data:`UPLOAD_CLIENTS` clients upload 100 MB each at once."""
    import grpc

    from remote_partitioner.client.blobs import upload_requests
    from remote_partitioner.client.errors import from_rpc_error
    from remote_partitioner.proto.digests import digest_of
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    args = [] if max_inflight is None else ["--max-inflight-bytes", str(max_inflight)]
    blobs = [os.urandom(UPLOAD_BYTES) for _ in range(UPLOAD_CLIENTS)]
    refused = [0] * UPLOAD_CLIENTS
    with server(*args) as (proc, target):
        baseline = peak_rss(proc.pid)
        go = threading.Barrier(UPLOAD_CLIENTS)

        def client(i: int) -> None:
            digest = digest_of(blobs[i])
            with grpc.insecure_channel(
                target, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as channel:
                stub = pb_grpc.RemotePartitionerStub(channel)
                go.wait()
                for _ in range(100):  # bounded: each refusal waits its RetryInfo delay
                    try:
                        stub.UploadBlobs(upload_requests([digest], {digest.hash: blobs[i]}),
                                         timeout=600)
                        return
                    except grpc.RpcError as e:
                        error = from_rpc_error(e)
                        if error.retry_delay is None:
                            raise
                        refused[i] += 1
                        time.sleep(error.retry_delay)
                raise RuntimeError("upload refused 100 times")

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(UPLOAD_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        return {
            "max_inflight_bytes": max_inflight, "clients": UPLOAD_CLIENTS,
            "bytes_each": UPLOAD_BYTES, "seconds": time.monotonic() - t0,
            "refused": sum(refused), "server_rss_before": baseline,
            "server_peak_rss": peak_rss(proc.pid),
            # Large blobs live in memory files, outside the RSS (see server/blobstore/buffer.py).
            "server_memory_file_bytes": memory_file_bytes(proc.pid),
        }


def report(results: dict[str, Any]) -> str:
    lines = [f"{'stalled':>8}{'calls/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'health max ms':>15}"
             f"{'errors':>8}"]
    for r in results["stalls"]:
        lines.append(f"{r['stalled']:>8}{r['calls_per_s']:>9.2f}{r['p50_s'] * 1e3:>8.1f}"
                     f"{r['p99_s'] * 1e3:>8.1f}{r['health_max_s'] * 1e3:>15.1f}"
                     f"{len(r['errors']):>8}")
    for u in results["uploads"]:
        bound = "default" if u["max_inflight_bytes"] is None else f"{u['max_inflight_bytes']}"
        lines.append(
            f"{u['clients']} x {u['bytes_each'] / 1e6:.0f} MB uploads at once, in-flight bound "
            f"{bound}: server peak RSS {u['server_peak_rss'] / 1e9:.2f} GB (before "
            f"{u['server_rss_before'] / 1e9:.2f} GB; blobs held "
            f"{u['clients'] * u['bytes_each'] / 1e9:.2f} GB, of which "
            f"{u.get('server_memory_file_bytes', 0) / 1e9:.2f} GB in memory files, outside the "
            f"RSS), {u['refused']} refusals retried, "
            f"{u['seconds']:.1f} s")
    return "\n".join(lines)


def run(seconds: float, stalled: Sequence[int], model: str = "mobilenet_v1_025"
        ) -> dict[str, Any]:
    results: dict[str, Any] = {"stalls": [], "uploads": []}
    for n in stalled:
        print(f"[bench] partition with {n} stalled uploads ...", file=sys.stderr, flush=True)
        results["stalls"].append(partition_under_stalls(n, seconds, model))
    for bound in (None, 512 * MIB):
        print(f"[bench] {UPLOAD_CLIENTS} concurrent uploads, bound {bound} ...", file=sys.stderr,
              flush=True)
        results["uploads"].append(concurrent_uploads(bound))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per stall level")
    parser.add_argument("--stalled", type=int, nargs="*", default=[0, 64, 512])
    parser.add_argument("--json", default="build/bench-load.json", help="where figures go")
    args = parser.parse_args(argv)
    results = run(args.seconds, args.stalled)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["concurrent_uploads", "partition_under_stalls", "run"]
