"""Load: stalled and slow streams cost the server memory, not its ability to serve.

The tests run ``remote-partitioner serve`` in its own process on a free loopback port, one
server per set of flags (tests that ask for the same flags share it: each leaves no stream
open), and hold streams open against it from this process (``grpc.aio`` clients on an event loop of
their own, so that hundreds of streams cost this process no threads either). Every loop is
bounded in count and time, and every stream is cancelled when the test ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import torch
from conftest import _serve
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from grpc_health.v1 import health_pb2, health_pb2_grpc
from models import small_models
from streams import MIB, StalledStreams

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.errors import RemotePartitionerError, from_rpc_error
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.errors import Reason
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


#: A blocked server answers no unary call until the stalled streams end (their idle time: 60 s
#: and 120 s here); a serving one answers at once. This bound tells the two apart on a loaded
#: 2-core machine; the latencies themselves are bench/load.py's to measure.
PROMPT_SECONDS = 5.0


def check_prompt(target: str) -> dict[str, float]:
    """Health and ListPartitioners each answer within ``PROMPT_SECONDS`` on a fresh channel
    (its connection counted); their latencies."""
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = pb_grpc.RemotePartitionerStub(channel)
        check = timed(lambda: health.Check(health_pb2.HealthCheckRequest(),
                                           timeout=PROMPT_SECONDS))
        listed = timed(lambda: stub.ListPartitioners(pb.ListPartitionersRequest(),
                                                     timeout=PROMPT_SECONDS))
    return {"health": check, "list": listed}


def lower_pte(partitioner: Any) -> bytes:
    model, inputs = small_models()["mlp"]
    ep = torch.export.export(model, inputs)
    return bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)


@pytest.fixture(scope="module")
def local_pte() -> bytes:
    return lower_pte(XnnpackPartitioner())


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    """``servers(*flags)``: the target of this module's server process with those flags,
    started on first use; all of them stopped when the module is done."""
    with contextlib.ExitStack() as stack:
        started: dict[tuple[str, ...], str] = {}

        def server_with(*flags: str) -> str:
            if flags not in started:
                started[flags] = stack.enter_context(_serve(tmp_path_factory, *flags))[1]
            return started[flags]

        yield server_with


@pytest.fixture()
def server(servers: Callable[..., str], request: pytest.FixtureRequest) -> str:
    """A server process with the flags the test's ``server_args`` marker names, shared with
    the tests that name the same."""
    marker = request.node.get_closest_marker("server_args")
    return servers(*(marker.args if marker else ()))


@pytest.mark.slow
def test_512_stalled_uploads_leave_health_and_partitioning_prompt(
    server: str, local_pte: bytes
) -> None:
    # 512 x 1 MiB declared: within the default in-flight bound (2 GiB), so every stream stays
    # open, stalled, while the checks run.
    with StalledStreams(server, 512, "upload", blob_bytes=MIB) as stalled:
        latencies = check_prompt(server)
        assert max(latencies.values()) < PROMPT_SECONDS, latencies
        remote = RemotePartitioner(server, "xnnpack", timeout=120)
        assert lower_pte(remote) == local_pte
        assert check_prompt(server)
        assert stalled.done() == 0, f"{stalled.done()} stalled streams ended early"


@pytest.mark.slow
@pytest.mark.server_args("--stream-idle-seconds", "120")
def test_slow_readers_leave_health_and_partitioning_prompt(
    server: str, local_pte: bytes
) -> None:
    data = bytes(range(256)) * (16 * MIB // 256)  # 16 chunks: far beyond a reader's window
    digest = digest_of(data)
    with grpc.insecure_channel(server) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        stub.UploadBlobs(iter(
            pb.UploadBlobsRequest(digest=digest, offset=off, data=data[off : off + MIB])
            for off in range(0, len(data), MIB)
        ), timeout=60)
    with StalledStreams(server, 64, "read", digest=digest) as stalled:
        assert max(check_prompt(server).values()) < PROMPT_SECONDS
        remote = RemotePartitioner(server, "xnnpack", timeout=120)
        assert lower_pte(remote) == local_pte
        assert stalled.done() == 0  # slow, not idle for 120 s: still open


@pytest.mark.slow
@pytest.mark.server_args("--max-inflight-bytes", str(12 * MIB), "--stream-idle-seconds", "6")
def test_idle_upload_is_cancelled_and_its_bytes_released(server: str) -> None:
    blob = b"\1" * (10 * MIB)
    digest = digest_of(blob)
    release = threading.Event()

    def stalled_upload() -> Iterator[pb.UploadBlobsRequest]:
        yield pb.UploadBlobsRequest(digest=digest, offset=0, data=blob[:MIB])
        release.wait(30)  # bounded: the server gives up after 6 s

    with grpc.insecure_channel(server) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        future = stub.UploadBlobs.future(stalled_upload(), timeout=60)
        try:
            # While the stalled stream holds 10 of the 12 MiB, another 10 MiB blob is refused
            # at once with a RetryInfo. (Until the server has read the stalled stream's first
            # message, the other blob's first MiB is taken and discarded as incomplete: ask
            # again, a bounded number of times, well inside the stalled stream's idle time.)
            time.sleep(0.5)
            other = b"\2" * (10 * MIB)
            other_digest = digest_of(other)
            for _ in range(30):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.UploadBlobs(iter([pb.UploadBlobsRequest(
                        digest=other_digest, offset=0, data=other[:MIB])]), timeout=30)
                error = from_rpc_error(refused.value)
                if error.reason != Reason.INCOMPLETE_BLOB.value:
                    break
                time.sleep(0.1)
            assert (error.code, error.reason) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED.value
            ), error
            assert error.retry_delay is not None and error.retry_delay > 0

            # The stalled stream is cancelled with a clear status after its idle time.
            with pytest.raises(grpc.RpcError) as idle:
                future.result(timeout=30)
            error = from_rpc_error(idle.value)
            assert (error.code, error.reason) == (
                grpc.StatusCode.DEADLINE_EXCEEDED, Reason.STREAM_IDLE.value
            ), error
            assert digest.hash in str(error) and "discarded" in str(error)
        finally:
            release.set()
        # Nothing of it was stored, and its reservation is free again: the other blob passes.
        missing = stub.FindMissingBlobs(pb.FindMissingBlobsRequest(digests=[digest]), timeout=10)
        assert list(missing.missing_digests) == [digest]
        committed = stub.UploadBlobs(iter(
            pb.UploadBlobsRequest(digest=other_digest, offset=off, data=other[off:off + MIB])
            for off in range(0, len(other), MIB)
        ), timeout=30)
        assert list(committed.committed_digests) == [other_digest]


@pytest.mark.slow
@pytest.mark.server_args("--max-inflight-bytes", str(4 * MIB), "--stream-idle-seconds", "10")
def test_the_client_retries_an_upload_refused_for_bytes_in_flight(
    server: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU())  # 2 MiB of weights
    inputs = (torch.randn(2, 512),)
    ep = torch.export.export(model, inputs)
    local = bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
                  .to_executorch().buffer)
    # A stalled stream holds 3.5 of the 4 MiB until the server cancels it (10 s idle), so the
    # client's first uploads are refused as OVERLOADED; it waits as told (1 s) and tries again,
    # up to 20 times. (The export runs before the stall: only the lowering runs inside it.)
    ep = torch.export.export(model, inputs)
    # The weights must cross for this: sent with every program (not withheld).
    remote = RemotePartitioner(server, "xnnpack", timeout=120, max_retries=20,
                               withhold_tensors=False)
    with StalledStreams(server, 1, "upload", blob_bytes=7 * MIB // 2):
        pte = bytes(to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer)
    assert pte == local
    assert remote.stats["overloaded_retries"] >= 1, remote.stats


@pytest.mark.slow
@pytest.mark.server_args("--max-inflight-bytes", str(4 * MIB), "--stream-idle-seconds", "10")
def test_the_lower_client_retries_an_upload_refused_for_bytes_in_flight(server: str) -> None:
    import io

    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU())  # 2 MiB of weights
    ep = torch.export.export(model, (torch.randn(2, 512),))
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    local = bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
                  .to_executorch().buffer)
    # As above: the archive's upload is refused until the stalled stream is cancelled.
    with StalledStreams(server, 1, "upload", blob_bytes=7 * MIB // 2), \
            LowerClient(server, timeout=120, max_retries=20) as client:
        result = client.lower(buffer.getvalue(), [partitioner_ref("xnnpack")])
    assert result.pte == local
    assert client.overloaded_retries >= 1


@pytest.mark.slow
def test_stalled_streams_are_cancelled_cleanly_on_shutdown(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SIGTERM with stalled uploads open: the server exits 0 within its grace period."""
    with contextlib.ExitStack() as stack:
        proc, target = stack.enter_context(_serve(tmp_path_factory, "--grace", "2"))
        stack.enter_context(StalledStreams(target, 32, "upload"))
        proc.terminate()
        assert proc.wait(timeout=30) == 0


@pytest.mark.slow
def test_a_bad_stream_request_is_refused_without_blocking(server: str) -> None:
    """A chunk out of order is refused at once even while other streams stall."""
    with StalledStreams(server, 16, "upload"), grpc.insecure_channel(server) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        d = digest_of(b"abc")
        with pytest.raises(grpc.RpcError) as e:
            stub.UploadBlobs(iter([pb.UploadBlobsRequest(digest=d, offset=1, data=b"bc")]),
                             timeout=5)
        assert from_rpc_error(e.value).reason == Reason.BAD_CHUNK.value
        assert isinstance(from_rpc_error(e.value), RemotePartitionerError)
