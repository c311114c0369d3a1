"""Production behaviour: hostile payloads, limits, overload, deadlines, reflection, health, CLI."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.program._fake_program import get_fake_program
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from torch.export import ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.errors import RemotePartitionerError
from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.app import SERVICE_NAME, create_server
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.settings import Limits


def _edge(width: int = 4) -> ExportedProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()).eval()
    return get_fake_program(to_edge(export(model, (torch.randn(2, width),))).exported_program())


class Server:
    """An in-process server with its stub; ``fails`` asserts a status and returns details."""

    def __init__(self, limits: Limits | None = None) -> None:
        # Result cache off: these tests need every hook call to run (and wait its turn).
        self.server, port = create_server("127.0.0.1:0", limits=limits, result_cache=ResultCache(0))
        self.server.start()
        self.target = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.RemotePartitionerStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(None)

    def upload(self, blobs: dict[str, Any]) -> None:
        requests = [
            pb.UploadBlobsRequest(digest=codec.digest_of(bytes(b)), offset=0, data=bytes(b))
            for b in blobs.values()
        ]
        self.stub.UploadBlobs(iter(requests), timeout=60)

    def fails(self, call: Any, code: grpc.StatusCode, reason: str) -> list[Any]:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == code, e.value.details()
        status = rpc_status.from_call(e.value)
        assert status is not None
        details: list[Any] = []
        for d in status.details:
            for cls in (
                error_details_pb2.ErrorInfo, error_details_pb2.BadRequest,
                error_details_pb2.RetryInfo,
            ):
                if d.Is(cls.DESCRIPTOR):
                    msg = cls()
                    d.Unpack(msg)
                    details.append(msg)
        info = [d for d in details if isinstance(d, error_details_pb2.ErrorInfo)]
        assert [i.reason for i in info] == [reason]
        self.assert_serving()
        return details

    def assert_serving(self) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        self.stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=10)


@pytest.fixture()
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _partition(s: Server, program: pb.Program, timeout: float = 60) -> pb.PartitionResponse:
    request = pb.PartitionRequest(partitioner=pb.PartitionerRef(name="xnnpack"), program=program)
    return s.stub.Partition(request, timeout=timeout)


# ------------------------------------------------------------------ nothing a client sends runs


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


@pytest.mark.parametrize(
    "target",
    ["os.system", "builtins.eval", "torch.load", "torch.ops.aten.__class__",
     "torch.ops.aten.linear", "subprocess.run", "../../etc/passwd", "torch._C._load_for_lite"],
)
def test_graph_naming_arbitrary_code_is_refused(
    server: Server, target: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    encoded = codec.encode_program(_edge())
    graph = json.loads(bytes(encoded.blobs[encoded.message.graph.hash]))
    nodes = graph["graph_module"]["graph"]["nodes"]
    nodes[0]["target"] = target
    nodes[0]["inputs"] = [
        {"name": "command", "arg": {"as_string": f"touch {marker}"}, "kind": 1}
    ]
    raw = json.dumps(graph).encode()
    server.upload({**encoded.blobs, "g": raw})
    program = pb.Program()
    program.CopyFrom(encoded.message)
    program.graph.CopyFrom(codec.digest_of(raw))
    server.fails(lambda: _partition(server, program), grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_PROGRAM")
    assert not marker.exists()


def test_pickles_are_never_loaded(server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Evil(str(marker)))
    encoded = codec.encode_program(_edge())
    server.upload({**encoded.blobs, "p": payload})
    # As the graph: not JSON, refused.
    program = pb.Program()
    program.CopyFrom(encoded.message)
    program.graph.CopyFrom(codec.digest_of(payload))
    server.fails(lambda: _partition(server, program), grpc.StatusCode.INVALID_ARGUMENT,
                 "INVALID_PROGRAM")
    # As a tensor's storage (a constant): raw bytes, never unpickled; the call succeeds.
    real = _with_constant(encoded.message, payload)
    _partition(server, real)
    assert not marker.exists()


def _with_constant(program: pb.Program, data: bytes) -> pb.Program:
    out = pb.Program()
    out.CopyFrom(program)
    out.constants.add(
        name="../../../tmp/evil", dtype="uint8", sizes=[len(data)], strides=[1],
        storage=codec.digest_of(data),
    )
    return out


def test_path_like_names_write_no_file(server: Server, tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        encoded = codec.encode_program(_edge())
        server.upload({**encoded.blobs, "c": b"abc"})
        _partition(server, _with_constant(encoded.message, b"abc"))
    finally:
        os.chdir(cwd)
    assert set(os.listdir(tmp_path)) == before


# ------------------------------------------------------------------ limits


def _violations(details: list[Any]) -> list[str]:
    return [
        v.field
        for d in details
        if isinstance(d, error_details_pb2.BadRequest)
        for v in d.field_violations
    ]


def test_limits_refuse_before_allocating() -> None:
    s = Server(Limits(max_blob_bytes=1000, max_nodes=3, max_digests=2, max_program_bytes=5000))
    try:
        big = pb.Digest(hash="a" * 64, size_bytes=10**15)
        details = s.fails(
            lambda: s.stub.FindMissingBlobs(pb.FindMissingBlobsRequest(digests=[big])),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED",
        )
        assert _violations(details) == ["digests"]
        details = s.fails(
            lambda: s.stub.UploadBlobs(iter([pb.UploadBlobsRequest(digest=big, data=b"x")])),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED",
        )
        assert _violations(details) == ["digest"]
        many = [pb.Digest(hash=f"{i:064x}", size_bytes=1) for i in range(3)]
        s.fails(lambda: s.stub.FindMissingBlobs(pb.FindMissingBlobsRequest(digests=many)),
                grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        encoded = codec.encode_program(_edge())
        details = s.fails(lambda: _partition(s, encoded.message),
                          grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        assert _violations(details) == ["program.fingerprint"]
    finally:
        s.close()


def test_program_bytes_limit() -> None:
    s = Server(Limits(max_program_bytes=1000))
    try:
        encoded = codec.encode_program(_edge(64))
        details = s.fails(lambda: _partition(s, encoded.message),
                          grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
        assert _violations(details) == ["program"]
    finally:
        s.close()


# ------------------------------------------------------------------ overload and deadlines


def _slow_program() -> ExportedProgram:
    from executorch.examples.models import MODEL_NAME_TO_MODEL
    from executorch.examples.models.model_factory import EagerModelFactory

    model, inputs, _, dyn = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL["mobilenet_v1_025"])
    edge = to_edge(export(model.eval(), inputs, dynamic_shapes=dyn, strict=True))
    return get_fake_program(edge.exported_program())


@pytest.mark.slow
def test_overload_is_refused_with_retry_info_and_the_client_retries() -> None:
    s = Server(Limits(max_concurrent_hooks=1, retry_after_seconds=0.2))
    try:
        slow = codec.encode_program(_slow_program())
        s.upload(slow.blobs)
        small = codec.encode_program(_edge())
        s.upload(small.blobs)
        done = threading.Event()
        results: list[Any] = []

        def busy() -> None:
            try:
                for _ in range(3):  # keep the only slot busy for a while
                    for _attempt in range(2000):  # bounded: the probes below may hold the slot
                        try:
                            results.append(_partition(s, slow.message, timeout=300))
                            break
                        except grpc.RpcError as e:
                            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                                raise
                            time.sleep(0.01)
            finally:
                done.set()

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            refused = None
            while refused is None and time.monotonic() < deadline and not done.is_set():
                try:
                    _partition(s, small.message)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        refused = e
                time.sleep(0.01)
            assert refused is not None, "a second call should have been refused while busy"
            status = rpc_status.from_call(refused)
            assert status is not None
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
            # The client waits as RetryInfo says and gets through once the slot frees.
            remote = RemotePartitioner(s.target, "xnnpack", max_retries=600, timeout=300)
            remote.partition(_edge())
        finally:
            thread.join(timeout=300)
        assert len(results) == 3
    finally:
        s.close()


@pytest.mark.slow  # waits for a slow partition to end (> 5 s)
def test_deadline_passed_while_waiting() -> None:
    s = Server()
    try:
        slow = codec.encode_program(_slow_program())
        s.upload(slow.blobs)
        small = codec.encode_program(_edge())
        s.upload(small.blobs)
        stop = threading.Event()

        def busy() -> None:
            for _ in range(200):  # bounded; the test stops it sooner
                if stop.is_set():
                    return
                _partition(s, slow.message, timeout=300)

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            codes = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and grpc.StatusCode.DEADLINE_EXCEEDED not in codes:
                try:
                    _partition(s, small.message, timeout=0.05)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())
            assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
            assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED}
        finally:
            stop.set()
            thread.join(timeout=300)
        s.assert_serving()
        remote = RemotePartitioner(s.target, "xnnpack", timeout=0.001)
        with pytest.raises(RemotePartitionerError) as err:
            remote.partition(_edge())
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        s.close()


# ------------------------------------------------------------------ conventions


def test_reflection_lists_every_service(server: Server) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    database = ProtoReflectionDescriptorDatabase(server.channel)
    services = set(database.get_services())
    assert {SERVICE_NAME, "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= services
    descriptor = database.FindFileContainingSymbol(SERVICE_NAME)
    assert descriptor.package == "remote_partitioner.v1"


def test_health_per_service(server: Server) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    with pytest.raises(grpc.RpcError) as e:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    server.assert_serving()


def test_cli_refuses_plaintext_on_a_public_address(capsys: pytest.CaptureFixture[str]) -> None:
    from remote_partitioner.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--address", "0.0.0.0:0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "--insecure" in err
