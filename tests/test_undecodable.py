"""Request bytes that do not parse get INTERNAL, naming the method and the message type, on every
method of every service the server hosts (unary or streaming, first message or later); the call
is counted in the metrics and the access log; the server keeps serving and loses nothing.

gRPC's convention for a request that does not parse is INTERNAL ("Error parsing request proto"
in its status-code table; grpcio's synchronous server, grpc-go and grpc-java answer so).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import descriptor
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.errors import DOMAIN
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.observability import (
    ACCESS_LOGGER,
    Metrics,
    ObservabilityInterceptor,
)

TIMEOUT = 30.0
#: Sizes of the junk requests (the issue's: 1, 17, 300, 5000 bytes).
SIZES = (1, 17, 300, 5000)

#: Every method of every service on the server, with its descriptor.
METHODS: list[descriptor.MethodDescriptor] = [
    *pb.DESCRIPTOR.services_by_name["RemotePartitioner"].methods,
    *health_pb2.DESCRIPTOR.services_by_name["Health"].methods,
    *reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].methods,
]


def method_path(m: descriptor.MethodDescriptor) -> str:
    return f"/{m.containing_service.full_name}/{m.name}"


def junk(size: int, message: descriptor.Descriptor, seed: int) -> bytes:
    """``size`` seeded random bytes that do not parse as ``message`` (checked here with the
    protobuf runtime, independently of the server)."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(message)
    rng = random.Random(seed)
    for _ in range(1000):
        data = bytes(rng.randrange(256) for _ in range(size))
        try:
            cls.FromString(data)
        except DecodeError:
            return data
    raise AssertionError(f"no {size}-byte junk for {message.full_name}")  # pragma: no cover


@dataclass
class Served:
    channel: grpc.Channel
    metrics: Metrics
    store: BlobStore

    def serving(self) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def internal_count(self, rpc: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "remote_partitioner_requests_total",
            {"rpc": rpc, "partitioner": "", "code": "INTERNAL"},
        )
        if value is None:  # the hook RPCs label an unreadable request's partitioner "other"
            value = self.metrics.registry.get_sample_value(
                "remote_partitioner_requests_total",
                {"rpc": rpc, "partitioner": "other", "code": "INTERNAL"},
            )
        return value or 0.0


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    store = BlobStore()
    metrics = Metrics(store)
    with inproc_server(
        blob_store=store, interceptors=[ObservabilityInterceptor(metrics)]
    ) as (_, target), grpc.insecure_channel(target) as channel:
        yield Served(channel, metrics, store)


def call_raw(
    channel: grpc.Channel, m: descriptor.MethodDescriptor, messages: list[bytes]
) -> grpc.RpcError:
    """Call ``m`` with raw request bytes (one message, or a stream of them); return the error
    it must end with."""
    raw = {"request_serializer": None, "response_deserializer": None}
    path = method_path(m)
    with pytest.raises(grpc.RpcError) as caught:
        if m.client_streaming and m.server_streaming:
            list(channel.stream_stream(path, **raw)(iter(messages), timeout=TIMEOUT))
        elif m.client_streaming:
            channel.stream_unary(path, **raw)(iter(messages), timeout=TIMEOUT)
        elif m.server_streaming:
            list(channel.unary_stream(path, **raw)(messages[0], timeout=TIMEOUT))
        else:
            channel.unary_unary(path, **raw)(messages[0], timeout=TIMEOUT)
    error = caught.value
    assert isinstance(error, grpc.RpcError)
    return error


def assert_unparsable(error: grpc.RpcError, m: descriptor.MethodDescriptor, size: int) -> None:
    path, message_type = method_path(m), m.input_type.full_name
    assert error.code() is grpc.StatusCode.INTERNAL, (path, error.code(), error.details())
    details = error.details() or ""
    assert details.startswith(f"{path}: the request ({size} bytes) does not parse as a "
                              f"{message_type} message"), details
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert [(i.reason, i.domain) for i in infos] == [("UNPARSABLE_REQUEST", DOMAIN)]
    assert dict(infos[0].metadata) == {"method": path, "message_type": message_type}


def rpc_label(m: descriptor.MethodDescriptor) -> str:
    service = m.containing_service.full_name
    return m.name if service == "remote_partitioner.v1.RemotePartitioner" else (
        f"{service}/{m.name}"
    )


@pytest.mark.parametrize("m", METHODS, ids=method_path)
def test_every_method_answers_junk_with_internal(
    served: Served, m: descriptor.MethodDescriptor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    before = served.internal_count(rpc_label(m))
    for i, size in enumerate(SIZES):
        data = junk(size, m.input_type, seed=i)
        assert_unparsable(call_raw(served.channel, m, [data]), m, size)
        assert served.serving()
    assert served.internal_count(rpc_label(m)) == before + len(SIZES)
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    mine = [line for line in lines
            if line.startswith(f"rpc={rpc_label(m)} ") and " code=INTERNAL " in line]
    assert len(mine) == len(SIZES), lines
    # The bytes received are counted (the message's size as it came).
    assert sorted(int(line.split(" in=")[1].split()[0]) for line in mine) == sorted(SIZES)


STREAMING_IN = [m for m in METHODS if m.client_streaming]


@pytest.mark.parametrize("m", STREAMING_IN, ids=method_path)
def test_junk_after_good_messages_on_a_stream(
    served: Served, m: descriptor.MethodDescriptor
) -> None:
    """The second message of a request stream does not parse: INTERNAL, naming it."""
    blob = b"x" * 100
    firsts = {
        "UploadBlobs": pb.UploadBlobsRequest(
            digest=digest_of(blob), offset=0, data=blob[:10]
        ),
        "ServerReflectionInfo": reflection_pb2.ServerReflectionRequest(list_services=""),
    }
    good = firsts[m.name].SerializeToString()
    data = junk(300, m.input_type, seed=7)
    assert_unparsable(call_raw(served.channel, m, [good, data]), m, 300)
    assert served.serving()


def test_an_upload_keeps_what_completed_before_the_junk(served: Served) -> None:
    """Blobs an upload stream completed before its junk message are stored; the blob it was in
    the middle of is discarded; the server serves the next upload."""
    stub = pb_grpc.RemotePartitionerStub(served.channel)
    whole = random.Random(1).randbytes(1000)
    partial = random.Random(2).randbytes(1000)
    w, p = digest_of(whole), digest_of(partial)
    upload = next(m for m in METHODS if m.name == "UploadBlobs")
    messages = [
        pb.UploadBlobsRequest(digest=w, offset=0, data=whole).SerializeToString(),
        pb.UploadBlobsRequest(digest=p, offset=0, data=partial[:500]).SerializeToString(),
        junk(17, upload.input_type, seed=3),
    ]
    assert_unparsable(call_raw(served.channel, upload, messages), upload, 17)
    missing = stub.FindMissingBlobs(pb.FindMissingBlobsRequest(digests=[w, p]), timeout=TIMEOUT)
    assert [d.hash for d in missing.missing_digests] == [p.hash]
    again = stub.UploadBlobs(iter([pb.UploadBlobsRequest(digest=p, offset=0, data=partial)]),
                             timeout=TIMEOUT)
    assert [d.hash for d in again.committed_digests] == [p.hash]
