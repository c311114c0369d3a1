"""Production behaviour: hostile payloads, limits, overload, deadlines, reflection, health, CLI."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
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
from servers import inproc_server, silent_target  # (tests/ is on sys.path)
from torch.export import ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.errors import RemotePartitionerError
from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.app import SERVICE_NAME
from remote_partitioner.server.blobstore import open_blob_store
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.settings import Limits


def _edge(width: int = 4) -> ExportedProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()).eval()
    return get_fake_program(to_edge(export(model, (torch.randn(2, width),))).exported_program())


class Server:
    """An in-process server with its stub; ``fails`` asserts a status and returns details.
    ``server_kwargs`` go to ``create_server``."""

    def __init__(self, limits: Limits | None = None, **server_kwargs: Any) -> None:
        self._stack = contextlib.ExitStack()
        # Result cache off: these tests need every hook call to run (and wait its turn).
        self.server, self.target = self._stack.enter_context(
            inproc_server(limits=limits, result_cache=ResultCache(0), **server_kwargs)
        )
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.RemotePartitionerStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self._stack.close()

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
        details = self.details(e.value)
        info = [d for d in details if isinstance(d, error_details_pb2.ErrorInfo)]
        assert [i.reason for i in info] == [reason]
        self.assert_serving()
        return details

    def reasons(self, error: grpc.RpcError) -> list[str]:
        """The reasons of the ErrorInfo details of ``error``'s status."""
        return [d.reason for d in self.details(error)
                if isinstance(d, error_details_pb2.ErrorInfo)]

    @staticmethod
    def details(error: grpc.RpcError) -> list[Any]:
        """The ErrorInfo, BadRequest and RetryInfo details of ``error``'s status."""
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
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


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (relative), with a file's bytes (None for a directory)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def test_path_like_names_write_no_file(tmp_path: Path) -> None:
    # The server's working directory and its blob directory lie five levels below ``root``,
    # so that wherever the name "../../../tmp/evil" is resolved from (either of them, or a
    # blob's fan-out directory), the path lands under ``root``, whose whole tree is compared.
    root = tmp_path / "root"
    cwd_dir = root / "a" / "b" / "c" / "d" / "cwd"
    blob_dir = root / "a" / "b" / "c" / "d" / "blobs"
    cwd_dir.mkdir(parents=True)
    evil = Path("/tmp/evil")
    evil_existed = evil.exists()
    store = open_blob_store(1 << 30, str(blob_dir))
    s = Server(blob_store=store)
    cwd = os.getcwd()
    os.chdir(cwd_dir)
    try:
        encoded = codec.encode_program(_edge())
        s.upload({**encoded.blobs, "c": b"abc"})
        before = _tree(root)
        assert any(k.startswith("a/b/c/d/blobs/") for k in before), "the blobs are on disk"
        _partition(s, _with_constant(encoded.message, b"abc"))
        after = _tree(root)
    finally:
        os.chdir(cwd)
        s.close()
    assert after == before
    assert evil.exists() == evil_existed


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
        stop = threading.Event()
        results: list[Any] = []

        def busy() -> None:
            try:
                for _ in range(100):  # keep the only slot busy until the client has retried
                    if stop.is_set():
                        break
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
            # The client waits as RetryInfo says and gets through once the slot frees. Its
            # first attempt may find the slot free between two busy calls: bounded, it tries
            # again while the slot is kept busy, until one call had to wait.
            retries = 0
            for _ in range(20):
                remote = RemotePartitioner(s.target, "xnnpack", max_retries=600, timeout=300)
                remote.partition(_edge())
                retries += remote.stats["overloaded_retries"]
                if retries or done.is_set():
                    break
            assert retries >= 1, "no call was refused and retried by the client"
        finally:
            stop.set()
            thread.join(timeout=300)
        assert done.is_set() and results, "the busy calls did not all end, or none ran"
    finally:
        s.close()


#: Metadata key: the seconds :class:`_ServerSeesLess` leaves a call.
_SERVER_SECONDS = "x-test-server-seconds"


class _ServerSeesLess(grpc.aio.ServerInterceptor):
    """A Partition call that sends :data:`_SERVER_SECONDS` reaches the servicer with its
    deadline that many seconds away, however long the client allows (as for a call that spent
    the rest of its time in transit); other calls pass unchanged.

    A server's deadline is the client's plus the transit, so a client sees its own deadline
    pass first: to see the status the server itself sends, the server's deadline must come
    first; everything else (the wait for the turn, the refusal, its status) is the server's."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        seconds = dict(details.invocation_metadata or ()).get(_SERVER_SECONDS)
        if handler is None or seconds is None or not details.method.endswith("/Partition"):
            return handler
        inner = handler.unary_unary

        async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await inner(request, _SoonerContext(context, float(seconds)))

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class _SoonerContext:
    """A servicer context whose ``time_remaining`` ends ``seconds`` from now."""

    def __init__(self, context: grpc.aio.ServicerContext, seconds: float) -> None:
        self._context = context
        self._deadline = time.monotonic() + seconds

    def time_remaining(self) -> float:
        return max(self._deadline - time.monotonic(), 0.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


@pytest.mark.slow  # partitions a model over and over for seconds
def test_deadline_passed_while_waiting() -> None:
    # While a slow partition holds the one hook slot, a call whose deadline (as the server
    # sees it) passes while it waits for its turn is refused by the server: DEADLINE_EXCEEDED,
    # reason DEADLINE_PASSED, long before the client's own 120 s deadline.
    s = Server(interceptors=[_ServerSeesLess()])
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
            # The server sees each call's deadline 0.1 s away (its client allows 120 s); a
            # slow partition holds the slot 0.2 s or more, so a call arriving mid-way waits
            # past its deadline. One arriving as the slot frees may instead start its work
            # and be refused just after its turn came ("before the work could start"), or be
            # answered: bounded, until one is refused while it waited.
            waited: list[list[Any]] = []
            answered, late = 0, 0
            deadline = time.monotonic() + 120
            while not waited and time.monotonic() < deadline:
                try:
                    s.stub.Partition(
                        pb.PartitionRequest(partitioner=pb.PartitionerRef(name="xnnpack"),
                                            program=small.message),
                        timeout=120, metadata=((_SERVER_SECONDS, "0.1"),),
                    )
                    answered += 1  # it found the slot free between two slow calls
                except grpc.RpcError as e:
                    said = e.details() or ""
                    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, said
                    assert s.reasons(e) == ["DEADLINE_PASSED"], said
                    if "while the call waited for its turn" in said:
                        waited.append(s.reasons(e))
                    else:
                        assert "before the work could start" in said, said
                        late += 1
            assert waited == [["DEADLINE_PASSED"]], (answered, late)
        finally:
            stop.set()
            thread.join(timeout=300)
        s.assert_serving()
        # The client's own deadline, against a port that never answers.
        with silent_target() as silent:
            remote = RemotePartitioner(silent, "xnnpack", timeout=0.5)
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
