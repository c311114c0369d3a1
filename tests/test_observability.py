"""Observability: metrics scraped over HTTP, request ids and access-log lines, against real
in-process servers on loopback (the service's own, and a bare one with all four handler kinds).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import re
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.program._fake_program import get_fake_program
from prometheus_client.parser import text_string_to_metric_families
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.app import Server
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.observability import (
    ACCESS_LOGGER,
    REQUEST_ID,
    Metrics,
    ObservabilityInterceptor,
    RequestIdFilter,
    configure_logging,
    request_id_from_metadata,
)
from remote_partitioner.server.registry import Registry, default_registry

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 30.0
HEX32 = re.compile(r"[0-9a-f]{32}")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- helpers --------------------------------------------------------------------------------


def scrape(port: int) -> Samples:
    """GET /metrics and parse it: (sample name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when absent (a label set never used)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def requests(samples: Samples, rpc: str, code: str, partitioner: str = "") -> float:
    return value(samples, "remote_partitioner_requests_total",
                 rpc=rpc, partitioner=partitioner, code=code)


def calls_counted(metrics: Metrics, rpc: str, code: str) -> float:
    """``remote_partitioner_requests_total`` of a bare server's calls (no partitioner label),
    read from the registry itself; 0 when never counted."""
    return metrics.registry.get_sample_value(
        "remote_partitioner_requests_total", {"rpc": rpc, "partitioner": "", "code": code}
    ) or 0.0


def digest(data: bytes) -> pb.Digest:
    return pb.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def request_id_of(metadata: Any) -> str | None:
    ids = [v for k, v in (metadata or ()) if k == "x-request-id"]
    assert len(ids) <= 1, ids
    return ids[0] if ids else None


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(plugins=False)


@dataclass
class Served:
    target: str
    metrics_port: int
    store: BlobStore
    metrics: Metrics
    channel: grpc.Channel
    stub: pb_grpc.RemotePartitionerStub


@pytest.fixture()
def served(registry: Registry) -> Iterator[Served]:
    """The service in this process with observability, and its metrics endpoint."""
    store = BlobStore()
    metrics = Metrics(store)
    with inproc_server(
        registry=registry, blob_store=store, interceptors=[ObservabilityInterceptor(metrics)],
    ) as (server, target):
        assert server.servicer is not None
        metrics.bind_server(server.servicer.streams)
        metrics_port = metrics.serve(0)
        channel = grpc.insecure_channel(target)
        try:
            yield Served(target, metrics_port, store, metrics, channel,
                         pb_grpc.RemotePartitionerStub(channel))
        finally:
            channel.close()
            metrics.stop()


# --- the service's metrics ------------------------------------------------------------------


def test_stream_gauges(served: Served) -> None:
    """Open streams and upload bytes in flight, as a stalled upload holds them and after."""
    from streams import MIB, StalledStreams

    def gauges() -> tuple[float | None, float | None]:
        sample = served.metrics.registry.get_sample_value
        return (sample("remote_partitioner_open_streams"),
                sample("remote_partitioner_inflight_upload_bytes"))

    assert gauges() == (0, 0)
    with StalledStreams(served.target, 2, "upload", blob_bytes=MIB):
        deadline = time.monotonic() + 10
        while gauges() != (2, 2 * MIB) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gauges() == (2, 2 * MIB)
    deadline = time.monotonic() + 10
    while gauges() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gauges() == (0, 0)  # the cancelled streams gave their bytes back
    scraped = urllib.request.urlopen(
        f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=TIMEOUT
    ).read().decode()
    assert "remote_partitioner_open_streams 0.0" in scraped


def test_metrics_of_real_calls(served: Served) -> None:
    stub = served.stub
    a, b = b"observability blob a", b"observability blob b"

    listed = stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=TIMEOUT)
    assert "xnnpack" in [p.name for p in listed.partitioners]

    missing = stub.FindMissingBlobs(
        pb.FindMissingBlobsRequest(digests=[digest(a), digest(b)]), timeout=TIMEOUT
    ).missing_digests
    assert len(missing) == 2
    committed = stub.UploadBlobs(
        iter([pb.UploadBlobsRequest(digest=digest(a), offset=0, data=a)]), timeout=TIMEOUT
    ).committed_digests
    assert [d.hash for d in committed] == [digest(a).hash]
    missing = stub.FindMissingBlobs(
        pb.FindMissingBlobsRequest(digests=[digest(a), digest(b)]), timeout=TIMEOUT
    ).missing_digests
    assert [d.hash for d in missing] == [digest(b).hash]
    chunks = list(stub.ReadBlobs(pb.ReadBlobsRequest(digests=[digest(a)]), timeout=TIMEOUT))
    assert b"".join(c.data for c in chunks) == a

    # Failures: a handler's abort (unary and inside a response stream) is counted with its code.
    for name in ("nope", "Not A Valid Label!"):
        with pytest.raises(grpc.RpcError) as e:
            stub.Partition(pb.PartitionRequest(partitioner=pb.PartitionerRef(name=name)),
                           timeout=TIMEOUT)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        list(stub.ReadBlobs(pb.ReadBlobsRequest(digests=[digest(b)]), timeout=TIMEOUT))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # (Each call is counted before its status leaves the server: no wait.)
    s = scrape(served.metrics_port)
    assert requests(s, "ListPartitioners", "OK") == 1
    assert requests(s, "FindMissingBlobs", "OK") == 2
    assert requests(s, "UploadBlobs", "OK") == 1
    assert requests(s, "ReadBlobs", "OK") == 1
    assert requests(s, "ReadBlobs", "NOT_FOUND") == 1
    assert requests(s, "Partition", "NOT_FOUND", "nope") == 1
    assert requests(s, "Partition", "NOT_FOUND", "other") == 1
    total = sum(v for (n, _), v in s.items() if n == "remote_partitioner_requests_total")
    assert total == 8
    assert value(s, "remote_partitioner_blob_cache_total", result="hit") == 1
    assert value(s, "remote_partitioner_blob_cache_total", result="miss") == 3
    assert value(s, "remote_partitioner_request_seconds_count",
                 rpc="FindMissingBlobs", partitioner="") == 2
    assert value(s, "remote_partitioner_request_seconds_bucket",
                 rpc="FindMissingBlobs", partitioner="", le="+Inf") == 2
    for rpc in ("ListPartitioners", "FindMissingBlobs", "UploadBlobs", "ReadBlobs"):
        assert value(s, "remote_partitioner_received_bytes_total", rpc=rpc) > 0 or \
            rpc == "ListPartitioners"
        assert value(s, "remote_partitioner_sent_bytes_total", rpc=rpc) > 0
    assert value(s, "remote_partitioner_received_bytes_total", rpc="UploadBlobs") > len(a)
    assert value(s, "remote_partitioner_sent_bytes_total", rpc="ReadBlobs") > len(a)
    assert value(s, "remote_partitioner_blob_store_bytes") == served.store.nbytes == len(a)
    assert value(s, "remote_partitioner_blob_store_blobs") == len(served.store) == 1

    # One real partition through the client.
    ep = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    fake = get_fake_program(to_edge(ep).exported_program())
    remote = RemotePartitioner(served.target, "xnnpack", timeout=TIMEOUT)
    try:
        result = remote.partition(fake)
    finally:
        remote.close()
    assert result.partition_tags

    after = scrape(served.metrics_port)
    # The client asks first by reference alone; the server lacks the program (BLOB_MISSING),
    # the client uploads it and asks again.
    assert requests(after, "Partition", "FAILED_PRECONDITION", "xnnpack") == 1
    assert requests(after, "Partition", "OK", "xnnpack") == 1
    assert value(after, "remote_partitioner_request_seconds_count",
                 rpc="Partition", partitioner="xnnpack") == 2
    assert value(after, "remote_partitioner_received_bytes_total", rpc="Partition") > \
        value(s, "remote_partitioner_received_bytes_total", rpc="Partition")
    assert value(after, "remote_partitioner_sent_bytes_total", rpc="Partition") > 0
    assert value(after, "remote_partitioner_blob_store_bytes") == served.store.nbytes > len(a)
    assert value(after, "remote_partitioner_blob_store_blobs") == len(served.store) > 1
    in_flight = [v for (n, _), v in after.items() if n == "remote_partitioner_in_flight"]
    assert in_flight and all(v == 0 for v in in_flight)


# --- request ids and access lines -----------------------------------------------------------


def test_request_id_echoed_and_logged(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    stub = served.stub

    _, call = stub.ListPartitioners.with_call(
        pb.ListPartitionersRequest(), metadata=(("x-request-id", "abc-123"),), timeout=TIMEOUT
    )
    assert request_id_of(call.initial_metadata()) == "abc-123"
    lines = access_lines(caplog)
    assert len(lines) == 1
    assert re.fullmatch(
        r"rpc=ListPartitioners partitioner=- code=OK ms=\d+\.\d in=0 out=\d+ "
        r"request_id=abc-123", lines[0]
    ), lines[0]

    _, call = stub.ListPartitioners.with_call(pb.ListPartitionersRequest(), timeout=TIMEOUT)
    generated = request_id_of(call.initial_metadata())
    assert generated is not None and HEX32.fullmatch(generated)
    assert access_lines(caplog)[-1].endswith(f"request_id={generated}")

    for bad in ("has space", "x" * 65, "semi;colon", ""):
        _, call = stub.ListPartitioners.with_call(
            pb.ListPartitionersRequest(), metadata=(("x-request-id", bad),), timeout=TIMEOUT
        )
        replaced = request_id_of(call.initial_metadata())
        assert replaced is not None and HEX32.fullmatch(replaced), (bad, replaced)

    # Errors carry the id too (initial metadata survives abort_with_status), unary and stream.
    with pytest.raises(grpc.RpcError) as e:
        stub.Partition(pb.PartitionRequest(partitioner=pb.PartitionerRef(name="nope")),
                       metadata=(("x-request-id", "err.1"),), timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert request_id_of(e.value.initial_metadata()) == "err.1"  # type: ignore[attr-defined]
    assert re.fullmatch(
        r"rpc=Partition partitioner=nope code=NOT_FOUND ms=\S+ in=\d+ out=0 request_id=err\.1",
        access_lines(caplog)[-1],
    )
    stream = stub.ReadBlobs(pb.ReadBlobsRequest(digests=[digest(b"absent")]),
                            metadata=(("x-request-id", "err_2"),), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError):
        list(stream)
    assert request_id_of(stream.initial_metadata()) == "err_2"
    assert access_lines(caplog)[-1].startswith(
        "rpc=ReadBlobs partitioner=- code=NOT_FOUND "
    )
    assert all(getattr(r, "request_id", None) for r in caplog.records if r.name == ACCESS_LOGGER)


# --- all four handler kinds, on a bare server -----------------------------------------------

_SERVICE = "test.Echo"
_log = logging.getLogger("tests.observability.handler")


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _answer() -> bytes:
    """What every test handler answers: the request id it sees, after logging a line."""
    _log.warning("handling")
    return (REQUEST_ID.get() or "").encode()


async def _unary_unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"raise":
        raise RuntimeError("unexpected")
    if request == b"abort":
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
    if request == b"slow":
        await asyncio.sleep(1.0)
    return _answer()


async def _unary_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield _answer()
    if request == b"abort":
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "enough")
    yield _answer()


async def _stream_unary(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    return b"".join([r async for r in requests]) and _answer()


async def _stream_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> None:
    """Writes with ``context.write`` (the other way to stream responses), counted all the same."""
    async for _ in requests:
        await context.write(_answer())


@pytest.fixture(params=[1, 2], ids=["one", "nested"])
def bare(request: pytest.FixtureRequest) -> Iterator[tuple[grpc.Channel, Metrics]]:
    """A server with the four handler kinds behind one ObservabilityInterceptor, or behind two
    (which must not send the id twice: gRPC refuses a second initial metadata)."""
    metrics = Metrics()
    inner = [ObservabilityInterceptor(Metrics(), logging.getLogger("tests.observability.inner"))
             for _ in range(request.param - 1)]

    async def build() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[ObservabilityInterceptor(metrics), *inner])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {
            "UU": grpc.unary_unary_rpc_method_handler(_unary_unary),
            "US": grpc.unary_stream_rpc_method_handler(_unary_stream),
            "SU": grpc.stream_unary_rpc_method_handler(_stream_unary),
            "SS": grpc.stream_stream_rpc_method_handler(_stream_stream),
        }),))
        return server, server.add_insecure_port("127.0.0.1:0")

    server = Server()
    port = server.bind(build)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, metrics
    finally:
        channel.close()
        server.stop(None).wait(30)


def test_every_handler_kind(
    bare: tuple[grpc.Channel, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    channel, metrics = bare
    caplog.set_level(logging.INFO)
    md = (("x-request-id", "kind-id"),)
    uu = channel.unary_unary(f"/{_SERVICE}/UU", None, None)
    us = channel.unary_stream(f"/{_SERVICE}/US", None, None)
    su = channel.stream_unary(f"/{_SERVICE}/SU", None, None)
    ss = channel.stream_stream(f"/{_SERVICE}/SS", None, None)

    # The handler sees the id in REQUEST_ID, and RequestIdFilter puts it on its log records.
    capture = _ListHandler()
    capture.addFilter(RequestIdFilter())
    _log.addHandler(capture)
    try:
        assert uu(b"x", metadata=md, timeout=TIMEOUT) == b"kind-id"
        assert list(us(b"x", metadata=md, timeout=TIMEOUT)) == [b"kind-id"] * 2
        assert su(iter([b"a", b"bc"]), metadata=md, timeout=TIMEOUT) == b"kind-id"
        assert list(ss(iter([b"a", b"b", b"c"]), metadata=md, timeout=TIMEOUT)) == \
            [b"kind-id"] * 3
        _log.warning("outside a call")
    finally:
        _log.removeHandler(capture)
    assert [getattr(r, "request_id", None) for r in capture.records] == ["kind-id"] * 7 + ["-"]
    assert REQUEST_ID.get() is None
    lines = access_lines(caplog)
    assert [line.split()[0] for line in lines] == [
        f"rpc={_SERVICE}/{k}" for k in ("UU", "US", "SU", "SS")
    ]
    assert all(line.endswith(" request_id=kind-id") for line in lines)

    with pytest.raises(grpc.RpcError) as e:
        uu(b"raise", timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    with pytest.raises(grpc.RpcError) as e:
        uu(b"abort", timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        list(us(b"abort", timeout=TIMEOUT))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    def count(rpc: str, code: str) -> float:
        return calls_counted(metrics, rpc, code)

    # A handler that outlives the call's deadline is counted as DEADLINE_EXCEEDED, once it ends.
    with pytest.raises(grpc.RpcError) as e:
        uu(b"slow", timeout=0.2)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10
    while count(f"{_SERVICE}/UU", "DEADLINE_EXCEEDED") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count(f"{_SERVICE}/UU", "DEADLINE_EXCEEDED") == 1

    assert count(f"{_SERVICE}/UU", "OK") == 1
    assert count(f"{_SERVICE}/UU", "UNKNOWN") == 1
    assert count(f"{_SERVICE}/UU", "PERMISSION_DENIED") == 1
    assert count(f"{_SERVICE}/US", "OK") == 1
    assert count(f"{_SERVICE}/US", "RESOURCE_EXHAUSTED") == 1
    assert count(f"{_SERVICE}/SU", "OK") == 1
    assert count(f"{_SERVICE}/SS", "OK") == 1
    received = metrics.registry.get_sample_value(
        "remote_partitioner_received_bytes_total", {"rpc": f"{_SERVICE}/SS"})
    sent = metrics.registry.get_sample_value(
        "remote_partitioner_sent_bytes_total", {"rpc": f"{_SERVICE}/SS"})
    assert received == 3 and sent == 3 * len(b"kind-id")
    for kind in ("UU", "US", "SU", "SS"):
        assert metrics.registry.get_sample_value(
            "remote_partitioner_in_flight", {"rpc": f"{_SERVICE}/{kind}"}) == 0


class _HeldLines(logging.Handler):
    """Holds each access line for up to 0.5 s, noting whether the client had the call's
    status meanwhile (``answered``, set by the test once the call returns or raises). The
    server's event loop waits in ``emit``: a call recorded before its status leaves cannot be
    answered during the wait."""

    def __init__(self, answered: threading.Event, counted: Callable[[], float]) -> None:
        super().__init__()
        self.answered = answered
        self.counted = counted
        self.answered_first: list[bool] = []
        self.counted_then: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counted_then.append(self.counted())
        self.answered_first.append(self.answered.wait(0.5))


def test_a_call_is_recorded_before_its_status_leaves(
    bare: tuple[grpc.Channel, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    """grpc.aio sends an aborted call's status inside ``abort``, before the handler unwinds:
    unless the interceptor records the call first, a client can hold the status of a call that
    is in no log and no metric yet (a replica killed at that moment never logs it)."""
    channel, metrics = bare
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    uu = channel.unary_unary(f"/{_SERVICE}/UU", None, None)
    us = channel.unary_stream(f"/{_SERVICE}/US", None, None)
    calls: list[tuple[str, str, Callable[[], object]]] = [
        ("UU", "PERMISSION_DENIED", lambda: uu(b"abort", timeout=TIMEOUT)),
        ("US", "RESOURCE_EXHAUSTED", lambda: list(us(b"abort", timeout=TIMEOUT))),
        ("UU", "OK", lambda: uu(b"x", timeout=TIMEOUT)),
    ]
    access = logging.getLogger(ACCESS_LOGGER)
    for kind, code, call in calls:

        def counted(kind: str = kind, code: str = code) -> float:
            return calls_counted(metrics, f"{_SERVICE}/{kind}", code)

        before = counted()
        answered = threading.Event()
        held = _HeldLines(answered, counted)
        access.addHandler(held)
        try:
            try:
                call()
                got = "OK"
            except grpc.RpcError as e:
                got = e.code().name
            answered.set()
        finally:
            access.removeHandler(held)
        assert got == code
        assert held.answered_first == [False], f"{code}: the status left before the record"
        assert held.counted_then == [before + 1], f"{code}: logged before it was counted"
        assert access_lines(caplog)[-1].split()[2] == f"code={code}"


# --- units ----------------------------------------------------------------------------------


def test_request_id_validation() -> None:
    assert request_id_from_metadata([("x-request-id", "A.b_c-9")]) == "A.b_c-9"
    assert request_id_from_metadata([("x-request-id", "y" * 64)]) == "y" * 64
    for bad in ("y" * 65, "a b", "é", ""):
        assert HEX32.fullmatch(request_id_from_metadata([("x-request-id", bad)]))
    assert HEX32.fullmatch(request_id_from_metadata([("other", "abc")]))
    assert HEX32.fullmatch(request_id_from_metadata(None))
    assert request_id_from_metadata(None) != request_id_from_metadata(None)


def test_partitioner_label_cardinality() -> None:
    open_ = ObservabilityInterceptor(None)
    assert open_.partitioner_label("xnnpack") == "xnnpack"
    assert open_.partitioner_label("my.backend-2_x") == "my.backend-2_x"
    for bad in ("", "XNNPACK", "a b", "x" * 65, "é"):
        assert open_.partitioner_label(bad) == "other"
    closed = ObservabilityInterceptor(None, known_partitioners=["xnnpack"])
    assert closed.partitioner_label("xnnpack") == "xnnpack"
    assert closed.partitioner_label("coreml") == "other"


def test_metrics_serve_and_stop() -> None:
    metrics = Metrics()
    port = metrics.serve(0)
    try:
        assert port > 0
        with pytest.raises(RuntimeError):
            metrics.serve(0)
        s = scrape(port)
        assert value(s, "remote_partitioner_blob_store_bytes") == 0
        assert value(s, "remote_partitioner_blob_cache_total", result="hit") == 0
    finally:
        metrics.stop()
    metrics.stop()
    with pytest.raises(OSError):
        scrape(port)


@pytest.fixture()
def restore_logging() -> Iterator[None]:
    root, access = logging.getLogger(), logging.getLogger(ACCESS_LOGGER)
    handlers, root_level, access_level = list(root.handlers), root.level, access.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(root_level)
        access.setLevel(access_level)


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging() -> None:
    buf = io.StringIO()
    configure_logging(stream=buf)
    assert logging.getLogger().level == logging.WARNING
    assert not logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO)

    configure_logging("info", stream=buf)  # replaces, does not add, its handler
    assert sum(isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is buf
               for h in logging.getLogger().handlers) == 1
    assert logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO)
    logging.getLogger("tests.observability").warning("outside")
    token = REQUEST_ID.set("inside-1")
    try:
        logging.getLogger("tests.observability").warning("inside")
    finally:
        REQUEST_ID.reset(token)
    out = buf.getvalue().splitlines()
    assert out[-2].endswith("WARNING tests.observability [-]: outside")
    assert out[-1].endswith("WARNING tests.observability [inside-1]: inside")

    configure_logging("DEBUG", stream=buf)
    assert logging.getLogger(ACCESS_LOGGER).level == logging.INFO
    with pytest.raises(ValueError):
        configure_logging("LOUD", stream=buf)
