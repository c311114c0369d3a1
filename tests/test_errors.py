"""Every error path of the service, against real servers on loopback.

Each error case asserts the gRPC status code, the ``google.rpc.ErrorInfo`` reason (and metadata)
carried in the ``grpc-status-details-bin`` trailer and the key words of the message, then that the
server still serves: ``ListPartitioners`` answers and ``grpc.health.v1`` reports SERVING.

Most cases run against the session's server subprocess (``server_address``, the default
registry); the cases of a hosted partitioner that raises run against an in-process server
hosting a small test partitioner.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from servers import inproc_server  # (tests/ is on sys.path)
from torch.export import ExportedProgram

from remote_partitioner.client import (
    FingerprintMismatchError,
    InvalidSpecError,
    PartitionerNotFoundError,
    RemotePartitioner,
    RemotePartitionerError,
)
from remote_partitioner.client.errors import RemoteTraceback
from remote_partitioner.proto import codec
from remote_partitioner.proto.codec import encode
from remote_partitioner.proto.errors import (
    BLOB_DIGEST,
    DOMAIN,
    EXCEPTION_MESSAGE,
    EXCEPTION_TRACEBACK,
    EXCEPTION_TYPE,
    EXPECTED_TYPE,
    SPEC_KEY,
    Reason,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.app import SERVICE_NAME
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.registry import HostedPartitioner, Registry, SpecKey

RPC_TIMEOUT = 60.0
HOSTED = ("coreml", "vulkan", "xnnpack")
Code = grpc.StatusCode


# --- a small model --------------------------------------------------------------------------


class SmallModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + x


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 4, generator=torch.Generator().manual_seed(0)),)


def _export() -> ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(SmallModel(), _inputs())


@pytest.fixture(scope="module")
def aten_ep() -> ExportedProgram:
    return _export()


@pytest.fixture(scope="module")
def edge_ep() -> ExportedProgram:
    return to_edge(_export()).exported_program()


@pytest.fixture(scope="module")
def encoded(edge_ep: ExportedProgram) -> codec.EncodedProgram:
    return codec.encode_program(edge_ep)


# --- talking to a server --------------------------------------------------------------------


def error_info(e: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The one ErrorInfo of the call's google.rpc.Status, or None when it sent no Status."""
    assert isinstance(e, grpc.Call)
    status = rpc_status.from_call(e)
    if status is None:
        return None
    assert status.code == e.code().value[0]
    assert status.message == e.details()
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    assert len(infos) == 1, status
    return infos[0]


class Conn:
    """A channel to a server, its stubs, and the checks every error case makes."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.RemotePartitionerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def assert_serving(self) -> None:
        listed = self.stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=RPC_TIMEOUT)
        assert listed.partitioners
        assert listed.versions.api == "v1"
        for service in ("", SERVICE_NAME):
            r = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, service

    def fails(
        self, call: Callable[[], Any], code: grpc.StatusCode, reason: Reason, *words: str
    ) -> tuple[str, dict[str, str]]:
        """Run ``call``; check its status code, ErrorInfo reason and message words; check the
        server still serves. Returns the message and the ErrorInfo metadata."""
        with pytest.raises(grpc.RpcError) as excinfo:
            call()
        e = excinfo.value
        assert isinstance(e, grpc.Call)
        assert e.code() == code, (e.code(), e.details())
        info = error_info(e)
        assert info is not None, f"no google.rpc.Status in {e.code()}: {e.details()}"
        assert info.domain == DOMAIN
        assert info.reason == reason.value
        message = e.details()
        for word in words:
            assert word in message, (word, message)
        self.assert_serving()
        return message, dict(info.metadata)

    # RPC helpers

    def upload(self, blobs: Iterable[bytes | memoryview]) -> pb.UploadBlobsResponse:
        chunks = [
            pb.UploadBlobsRequest(digest=codec.digest_of(b), offset=0, data=bytes(b)) for b in blobs
        ]
        return self.stub.UploadBlobs(iter(chunks), timeout=RPC_TIMEOUT)

    def upload_chunks(self, chunks: Iterable[pb.UploadBlobsRequest]) -> pb.UploadBlobsResponse:
        return self.stub.UploadBlobs(iter(list(chunks)), timeout=RPC_TIMEOUT)

    def missing(self, *digests: pb.Digest) -> list[pb.Digest]:
        r = self.stub.FindMissingBlobs(
            pb.FindMissingBlobsRequest(digests=digests), timeout=RPC_TIMEOUT
        )
        return list(r.missing_digests)

    def read(self, *digests: pb.Digest) -> list[pb.ReadBlobsResponse]:
        return list(self.stub.ReadBlobs(pb.ReadBlobsRequest(digests=digests), timeout=RPC_TIMEOUT))

    def partition(self, program: pb.Program, name: str = "xnnpack", spec: Any = ()) -> Any:
        ref = pb.PartitionerRef(name=name, spec=spec)
        return self.stub.Partition(
            pb.PartitionRequest(partitioner=ref, program=program), timeout=RPC_TIMEOUT
        )


@pytest.fixture(scope="module")
def conn(server_address: str) -> Iterator[Conn]:
    c = Conn(server_address)
    c.assert_serving()
    yield c
    c.close()


@pytest.fixture()
def program(conn: Conn, encoded: codec.EncodedProgram) -> pb.Program:
    """A fresh copy of the Edge program's message, its blobs uploaded to the server."""
    conn.upload(encoded.blobs.values())
    assert conn.missing(*encoded.digests()) == []
    m = pb.Program()
    m.CopyFrom(encoded.message)
    return m


def _unique(n: int = 64) -> bytes:
    """Bytes no other call has sent (so the blob is surely not held)."""
    return os.urandom(n)


def _chunk(digest: pb.Digest, offset: int, data: bytes) -> pb.UploadBlobsRequest:
    return pb.UploadBlobsRequest(digest=digest, offset=offset, data=data)


# --- 1. unknown partitioner -----------------------------------------------------------------

HOOK_RPCS = {
    "Partition": (pb.PartitionRequest, "Partition"),
    "OpsToNotDecompose": (pb.OpsToNotDecomposeRequest, "OpsToNotDecompose"),
    "TransformForPreDecomposition": (
        pb.TransformForPreDecompositionRequest,
        "TransformForPreDecomposition",
    ),
}


def _hook_call(conn: Conn, rpc: str, name: str, prog: pb.Program, spec: Any = ()) -> Any:
    request_type, method = HOOK_RPCS[rpc]
    request = request_type(partitioner=pb.PartitionerRef(name=name, spec=spec), program=prog)
    return lambda: getattr(conn.stub, method)(request, timeout=RPC_TIMEOUT)


def test_untampered_program_partitions(conn: Conn, program: pb.Program) -> None:
    """The control for the cases below: the same program, untouched, is accepted."""
    response = conn.partition(program)
    assert response.tags and response.partition_tags


@pytest.mark.parametrize("rpc", list(HOOK_RPCS))
def test_unknown_partitioner_raw(conn: Conn, program: pb.Program, rpc: str) -> None:
    message, _ = conn.fails(
        _hook_call(conn, rpc, "no_such_partitioner", program),
        Code.NOT_FOUND,
        Reason.UNKNOWN_PARTITIONER,
        "no_such_partitioner",
        *HOSTED,
    )
    assert "hosted: " in message


def test_unknown_partitioner_client_partition(conn: Conn, edge_ep: ExportedProgram) -> None:
    remote = RemotePartitioner(conn.target, "no_such_partitioner")
    try:
        with pytest.raises(PartitionerNotFoundError) as excinfo:
            remote.partition(edge_ep)
    finally:
        remote.close()
    e = excinfo.value
    assert isinstance(e, KeyError) and isinstance(e, RemotePartitionerError)
    assert e.code == Code.NOT_FOUND
    assert e.reason == Reason.UNKNOWN_PARTITIONER.value
    assert "no_such_partitioner" in str(e)
    for name in HOSTED:
        assert name in str(e)
    conn.assert_serving()


def test_unknown_partitioner_client_discovery(conn: Conn, aten_ep: ExportedProgram) -> None:
    """Hooks that first look the partitioner up (ListPartitioners) raise the same error."""
    remote = RemotePartitioner(conn.target, "no_such_partitioner")
    try:
        for hook in (remote.ops_to_not_decompose, remote.transform_for_pre_decomposition):
            with pytest.raises(PartitionerNotFoundError) as excinfo:
                hook(aten_ep)
            e = excinfo.value
            assert isinstance(e, KeyError)
            assert (e.code, e.reason) == (Code.NOT_FOUND, Reason.UNKNOWN_PARTITIONER.value)
            assert "no_such_partitioner" in str(e)
            for name in HOSTED:
                assert name in str(e)
    finally:
        remote.close()
    conn.assert_serving()


# --- 2. spec --------------------------------------------------------------------------------


def _entry(key: str, **value: Any) -> pb.SpecEntry:
    return pb.SpecEntry(key=key, value=pb.SpecValue(**value))


@pytest.mark.parametrize("rpc", list(HOOK_RPCS))
def test_unknown_spec_key(conn: Conn, program: pb.Program, rpc: str) -> None:
    _, meta = conn.fails(
        _hook_call(conn, rpc, "xnnpack", program, [_entry("bogus_key", bool_value=True)]),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_SPEC,
        "bogus_key",
        "unknown spec key",
        "per_op_mode",  # the accepted keys are listed
    )
    assert meta[SPEC_KEY] == "bogus_key"
    assert meta[EXPECTED_TYPE] == ""


@pytest.mark.parametrize(
    "name, key, value, expected",
    [
        ("xnnpack", "per_op_mode", {"string_value": "yes"}, "bool"),
        ("xnnpack", "per_op_mode", {"int_value": 1}, "bool"),
        ("xnnpack", "enable_bf16", {"double_value": 1.0}, "bool"),
        ("xnnpack", "configs", {"bytes_value": b"LinearConfig"}, "str"),
        ("vulkan", "buffer_limit", {"bool_value": True}, "int"),
        ("vulkan", "buffer_limit", {"double_value": 2.0}, "int"),
        ("coreml", "lower_full_graph", {"string_value": "true"}, "bool"),
    ],
    ids=lambda v: str(next(iter(v))) if isinstance(v, dict) else str(v),
)
def test_ill_typed_spec_key(
    conn: Conn, program: pb.Program, name: str, key: str, value: dict[str, Any], expected: str
) -> None:
    _, meta = conn.fails(
        lambda: conn.partition(program, name, [_entry(key, **value)]),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_SPEC,
        key,
        f"expects {expected}",
    )
    assert (meta[SPEC_KEY], meta[EXPECTED_TYPE]) == (key, expected)


def test_spec_key_without_value(conn: Conn, program: pb.Program) -> None:
    _, meta = conn.fails(
        lambda: conn.partition(program, spec=[pb.SpecEntry(key="per_op_mode")]),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_SPEC,
        "per_op_mode",
        "bool",
    )
    assert (meta[SPEC_KEY], meta[EXPECTED_TYPE]) == ("per_op_mode", "bool")


def test_unparsable_spec_value(conn: Conn, program: pb.Program) -> None:
    _, meta = conn.fails(
        lambda: conn.partition(program, spec=[_entry("configs", string_value="NoSuchConfig")]),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_SPEC,
        "configs",
        "NoSuchConfig",
        "LinearConfig",
    )
    assert meta[SPEC_KEY] == "configs"


@pytest.mark.parametrize("second", [True, False])
def test_duplicate_spec_key(conn: Conn, program: pb.Program, second: bool) -> None:
    spec = [_entry("per_op_mode", bool_value=True), _entry("per_op_mode", bool_value=second)]
    conn.fails(
        lambda: conn.partition(program, spec=spec),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_SPEC,
        "per_op_mode",
        "more than once",
    )


@pytest.mark.parametrize(
    "spec, key, words",
    [
        ({"bogus_key": True}, "bogus_key", ("unknown spec key",)),
        ({"per_op_mode": "yes"}, "per_op_mode", ("expects bool",)),
        ({"per_op_mode": 1}, "per_op_mode", ("expects bool",)),
    ],
)
def test_bad_spec_through_client(
    conn: Conn, edge_ep: ExportedProgram, spec: dict[str, Any], key: str, words: tuple[str, ...]
) -> None:
    remote = RemotePartitioner(conn.target, "xnnpack", spec)
    try:
        with pytest.raises(InvalidSpecError) as excinfo:
            remote.partition(edge_ep)
    finally:
        remote.close()
    e = excinfo.value
    assert isinstance(e, ValueError) and isinstance(e, RemotePartitionerError)
    assert (e.code, e.reason) == (Code.INVALID_ARGUMENT, Reason.INVALID_SPEC.value)
    assert e.metadata[SPEC_KEY] == key
    assert key in str(e)
    for word in words:
        assert word in str(e)
    assert not any("delegation_tag" in n.meta for n in edge_ep.graph.nodes)
    conn.assert_serving()


# --- 3. undecodable programs ----------------------------------------------------------------


@pytest.mark.parametrize("dialect", [pb.DIALECT_EDGE, pb.DIALECT_ATEN], ids=["edge", "aten"])
@pytest.mark.parametrize(
    "graph, words",
    [
        (b"this is not JSON {", ("not JSON",)),
        (b"\xff\xfe\x00binary", ()),
        (b'{"hello": "world"}', ("TypeError",)),
        (b"[1, 2, 3]", ()),
        (b"null", ()),
        (b'"a string"', ()),
        (b"", ()),
    ],
    ids=["not-json", "binary", "json-object", "json-array", "json-null", "json-string", "empty"],
)
def test_graph_blob_is_not_a_program(
    conn: Conn, program: pb.Program, dialect: int, graph: bytes, words: tuple[str, ...]
) -> None:
    conn.upload([graph])
    program.dialect = dialect
    program.graph.CopyFrom(codec.digest_of(graph))
    conn.fails(
        lambda: conn.partition(program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "cannot be decoded",
        "cannot be deserialized",
        *words,
    )


@pytest.mark.parametrize("rpc", list(HOOK_RPCS))
def test_dialect_unset(conn: Conn, program: pb.Program, rpc: str) -> None:
    program.dialect = pb.DIALECT_UNSPECIFIED
    conn.fails(
        _hook_call(conn, rpc, "xnnpack", program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "dialect is not set",
    )


def test_empty_program_message(conn: Conn) -> None:
    conn.fails(
        lambda: conn.partition(pb.Program()),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "dialect is not set",
    )


def test_program_without_graph(conn: Conn, program: pb.Program) -> None:
    program.ClearField("graph")
    conn.fails(
        lambda: conn.partition(program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "has no graph",
    )


@pytest.mark.parametrize("dtype", ["float33", "", "torch.float32", "Float32"])
def test_tensor_with_unknown_dtype(conn: Conn, program: pb.Program, dtype: str) -> None:
    ref = program.state_dict[0]
    ref.dtype = dtype
    conn.fails(
        lambda: conn.partition(program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "unknown dtype",
        repr(dtype),
        ref.name,
    )


def _set(ref: pb.TensorRef, **fields: Any) -> None:
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(ref, name)[:] = value
        else:
            setattr(ref, name, value)


@pytest.mark.parametrize(
    "fields, words",
    [
        # linear.weight is 4x4 float32: a 64-byte storage.
        ({"sizes": [5, 4]}, ("reaches beyond its storage of 64 bytes",)),
        ({"storage_offset": 1}, ("reaches beyond its storage of 64 bytes",)),
        ({"strides": [5, 1]}, ("reaches beyond its storage of 64 bytes",)),
        ({"strides": [4, -1]}, ("reaches beyond its storage",)),
        ({"dtype": "float64"}, ("reaches beyond its storage of 64 bytes",)),
        ({"sizes": [1 << 40, 1 << 40]}, ("reaches beyond its storage",)),
        ({"sizes": [4]}, ("malformed sizes or strides",)),
        ({"sizes": [-4, 4]}, ("malformed sizes or strides",)),
        ({"storage_offset": -1}, ("malformed sizes or strides",)),
    ],
    ids=[
        "sizes",
        "storage-offset",
        "strides",
        "negative-stride",
        "wider-dtype",
        "huge-sizes",
        "rank-mismatch",
        "negative-size",
        "negative-offset",
    ],
)
def test_tensor_beyond_its_storage(
    conn: Conn, program: pb.Program, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    ref = program.state_dict[0]
    assert (list(ref.sizes), ref.dtype, ref.storage.size_bytes) == ([4, 4], "float32", 64)
    _set(ref, **fields)
    conn.fails(
        lambda: conn.partition(program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        "cannot be decoded",
        repr(ref.name),
        *words,
    )


def test_real_tensor_without_storage(conn: Conn, program: pb.Program) -> None:
    ref = program.state_dict[0]
    ref.ClearField("storage")
    conn.fails(
        lambda: conn.partition(program),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_PROGRAM,
        repr(ref.name),
        "has no storage",
    )


# --- 4. blobs -------------------------------------------------------------------------------

SHA_EMPTY = hashlib.sha256(b"").hexdigest()

BAD_DIGESTS = [
    pytest.param(SHA_EMPTY.upper(), 0, "64 lowercase hexadecimal", id="uppercase"),
    pytest.param(SHA_EMPTY[:-1], 0, "64 lowercase hexadecimal", id="63-chars"),
    pytest.param(SHA_EMPTY + "0", 0, "64 lowercase hexadecimal", id="65-chars"),
    pytest.param("g" + SHA_EMPTY[1:], 0, "64 lowercase hexadecimal", id="non-hex"),
    pytest.param(" " + SHA_EMPTY[1:], 0, "64 lowercase hexadecimal", id="space"),
    pytest.param("", 0, "64 lowercase hexadecimal", id="empty"),
    pytest.param(SHA_EMPTY, -1, "negative size", id="negative-size"),
]


@pytest.mark.parametrize("hash_, size, words", BAD_DIGESTS)
def test_malformed_digest_find_missing(conn: Conn, hash_: str, size: int, words: str) -> None:
    good = codec.digest_of(b"")
    conn.fails(
        lambda: conn.missing(good, pb.Digest(hash=hash_, size_bytes=size)),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_DIGEST,
        words,
    )


@pytest.mark.parametrize("hash_, size, words", BAD_DIGESTS)
def test_malformed_digest_upload(conn: Conn, hash_: str, size: int, words: str) -> None:
    bad = pb.Digest(hash=hash_, size_bytes=size)
    conn.fails(
        lambda: conn.upload_chunks([_chunk(bad, 0, b"")]),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_DIGEST,
        words,
    )


@pytest.mark.parametrize("hash_, size, words", BAD_DIGESTS)
def test_malformed_digest_read(conn: Conn, hash_: str, size: int, words: str) -> None:
    conn.fails(
        lambda: conn.read(pb.Digest(hash=hash_, size_bytes=size)),
        Code.INVALID_ARGUMENT,
        Reason.INVALID_DIGEST,
        words,
    )


def test_upload_digest_mismatch(conn: Conn) -> None:
    declared_bytes, sent = _unique(), _unique()
    declared, actual = codec.digest_of(declared_bytes), codec.digest_of(sent)
    assert declared.size_bytes == actual.size_bytes
    _, meta = conn.fails(
        lambda: conn.upload_chunks([_chunk(declared, 0, sent)]),
        Code.DATA_LOSS,
        Reason.DIGEST_MISMATCH,
        declared.hash,
        f"hashes to {actual.hash}",
    )
    assert meta[BLOB_DIGEST] == declared.hash
    assert conn.missing(declared, actual) == [declared, actual]


def test_bytes_declared_as_the_empty_blob(conn: Conn) -> None:
    """Bytes declared as the empty blob: the chunk is past the declared size 0."""
    empty = codec.digest_of(b"")
    _, meta = conn.fails(
        lambda: conn.upload_chunks([_chunk(empty, 0, b"x")]),
        Code.INVALID_ARGUMENT,
        Reason.BAD_CHUNK,
        "exceed the declared size 0",
    )
    assert meta[BLOB_DIGEST] == empty.hash


def test_upload_digest_mismatch_after_good_chunks(conn: Conn) -> None:
    data = _unique(100)
    declared = codec.digest_of(_unique(100))
    chunks = [_chunk(declared, off, data[off : off + 30]) for off in range(0, 100, 30)]
    conn.fails(
        lambda: conn.upload_chunks(chunks), Code.DATA_LOSS, Reason.DIGEST_MISMATCH, declared.hash
    )
    assert conn.missing(declared) == [declared]


def test_a_mismatch_between_good_blobs_keeps_the_blobs_before_it(conn: Conn) -> None:
    """A blob is verified while the next one arrives: a mismatch still ends the stream, the
    blobs before it stay stored and none after it is."""
    first, third = _unique(2000), _unique(2000)
    good, later = codec.digest_of(first), codec.digest_of(third)
    declared = codec.digest_of(_unique(2000))
    chunks = [_chunk(good, 0, first), _chunk(declared, 0, _unique(2000)), _chunk(later, 0, third)]
    _, meta = conn.fails(
        lambda: conn.upload_chunks(chunks), Code.DATA_LOSS, Reason.DIGEST_MISMATCH, declared.hash
    )
    assert meta[BLOB_DIGEST] == declared.hash
    assert conn.missing(good, declared, later) == [declared, later]


def test_stream_ends_mid_blob(conn: Conn) -> None:
    data = _unique(10)
    d = codec.digest_of(data)
    _, meta = conn.fails(
        lambda: conn.upload_chunks([_chunk(d, 0, data[:4])]),
        Code.DATA_LOSS,
        Reason.INCOMPLETE_BLOB,
        "stream ended after 4 of 10 bytes",
        d.hash,
    )
    assert meta[BLOB_DIGEST] == d.hash
    assert conn.missing(d) == [d]


def test_next_blob_starts_before_previous_completes(conn: Conn) -> None:
    a, b = _unique(10), _unique(10)
    da, db = codec.digest_of(a), codec.digest_of(b)
    _, meta = conn.fails(
        lambda: conn.upload_chunks([_chunk(da, 0, a[:4]), _chunk(db, 0, b)]),
        Code.DATA_LOSS,
        Reason.INCOMPLETE_BLOB,
        da.hash,
        "ended after 4 of 10 bytes",
    )
    assert meta[BLOB_DIGEST] == da.hash
    assert conn.missing(da, db) == [da, db]


@pytest.mark.parametrize(
    "pieces, words",
    [
        ([(3, slice(3, 10))], "chunk at offset 3, expected 0"),
        ([(0, slice(0, 4)), (8, slice(8, 10))], "chunk at offset 8, expected 4"),
        ([(5, slice(5, 10)), (0, slice(0, 5))], "chunk at offset 5, expected 0"),
        ([(0, slice(0, 4)), (0, slice(0, 4))], "chunk at offset 0, expected 4"),
        ([(0, slice(0, 4)), (2, slice(2, 10))], "chunk at offset 2, expected 4"),
        ([(0, slice(0, 4)), (-1, slice(4, 10))], "chunk at offset -1, expected 4"),
    ],
    ids=["starts-late", "skips", "swapped", "repeated", "overlaps", "negative"],
)
def test_chunk_out_of_order(conn: Conn, pieces: list[tuple[int, slice]], words: str) -> None:
    data = _unique(10)
    d = codec.digest_of(data)
    _, meta = conn.fails(
        lambda: conn.upload_chunks([_chunk(d, off, data[s]) for off, s in pieces]),
        Code.INVALID_ARGUMENT,
        Reason.BAD_CHUNK,
        words,
        d.hash,
    )
    assert meta[BLOB_DIGEST] == d.hash
    assert conn.missing(d) == [d]


def test_chunk_past_declared_size(conn: Conn) -> None:
    data = _unique(10)
    d = codec.digest_of(data)
    conn.fails(
        lambda: conn.upload_chunks([_chunk(d, 0, data[:6]), _chunk(d, 6, data[6:] + b"xx")]),
        Code.INVALID_ARGUMENT,
        Reason.BAD_CHUNK,
        "exceed the declared size 10",
    )
    assert conn.missing(d) == [d]


def test_failed_uploads_store_nothing(inproc_server: tuple[Any, str]) -> None:
    """On an in-process server, look at the store itself: no failed blob is held."""
    store, target = inproc_server
    assert isinstance(store, BlobStore)
    c = Conn(target)
    try:
        data = _unique(10)
        d, other = codec.digest_of(data), codec.digest_of(_unique(10))
        cases: list[tuple[list[pb.UploadBlobsRequest], grpc.StatusCode, Reason]] = [
            ([_chunk(other, 0, data)], Code.DATA_LOSS, Reason.DIGEST_MISMATCH),
            ([_chunk(d, 0, data[:5])], Code.DATA_LOSS, Reason.INCOMPLETE_BLOB),
            (
                [_chunk(d, 0, data[:5]), _chunk(d, 6, data[6:])],
                Code.INVALID_ARGUMENT,
                Reason.BAD_CHUNK,
            ),
            ([_chunk(d, 0, data + b"!")], Code.INVALID_ARGUMENT, Reason.BAD_CHUNK),
        ]
        for chunks, code, reason in cases:
            c.fails(lambda chunks=chunks: c.upload_chunks(chunks), code, reason)
            assert len(store) == 0 and store.nbytes == 0
            assert store.get(d.hash) is None and store.get(other.hash) is None
        # A good blob after all that is stored, once.
        assert list(c.upload([data]).committed_digests) == [d]
        assert store.get(d.hash) == data and len(store) == 1
    finally:
        c.close()


def test_read_unknown_blob(conn: Conn) -> None:
    d = codec.digest_of(_unique())
    _, meta = conn.fails(
        lambda: conn.read(d), Code.NOT_FOUND, Reason.BLOB_NOT_FOUND, d.hash, "is not held"
    )
    assert meta[BLOB_DIGEST] == d.hash


def test_read_held_blob_with_wrong_size(conn: Conn) -> None:
    data = _unique(32)
    d = codec.digest_of(data)
    conn.upload([data])
    wrong = pb.Digest(hash=d.hash, size_bytes=33)
    conn.fails(lambda: conn.read(wrong), Code.NOT_FOUND, Reason.BLOB_NOT_FOUND, d.hash)
    # The held one, then the unknown one: the call fails as a whole.
    conn.fails(
        lambda: conn.read(d, codec.digest_of(_unique())), Code.NOT_FOUND, Reason.BLOB_NOT_FOUND
    )


def _reassemble(chunks: list[pb.ReadBlobsResponse]) -> list[tuple[pb.Digest, bytes]]:
    """Chunks -> (digest, bytes) per blob, checking offsets run from 0 without gaps."""
    out: list[tuple[pb.Digest, bytearray]] = []
    for c in chunks:
        if c.offset == 0:
            out.append((c.digest, bytearray()))
        digest, buf = out[-1]
        assert c.digest == digest
        assert c.offset == len(buf)
        buf += c.data
    return [(d, bytes(b)) for d, b in out]


def test_multi_chunk_and_empty_blobs_round_trip(conn: Conn) -> None:
    big = _unique((5 << 19) + 123)  # 2.5 MiB and a bit: three 1 MiB read chunks
    small, empty = _unique(7), b""
    dbig, dsmall, dempty = codec.digest_of(big), codec.digest_of(small), codec.digest_of(empty)
    assert conn.missing(dbig, dsmall) == [dbig, dsmall]
    step = 700_001
    chunks = [_chunk(dbig, off, big[off : off + step]) for off in range(0, len(big), step)]
    assert len(chunks) == 4
    chunks += [_chunk(dempty, 0, b""), _chunk(dsmall, 0, small[:3]), _chunk(dsmall, 3, small[3:])]
    response = conn.upload_chunks(chunks)
    assert list(response.committed_digests) == [dbig, dempty, dsmall]
    assert conn.missing(dbig, dempty, dsmall) == []
    # Uploading again is harmless.
    assert list(conn.upload([small]).committed_digests) == [dsmall]

    read = conn.read(dsmall, dbig, dempty)
    assert len(read) == 1 + 3 + 1
    assert _reassemble(read) == [(dsmall, small), (dbig, big), (dempty, b"")]


def test_program_declares_another_size(conn: Conn, program: pb.Program) -> None:
    real = program.graph.size_bytes
    program.graph.size_bytes = real + 1
    conn.fails(
        lambda: conn.partition(program),
        Code.DATA_LOSS,
        Reason.SIZE_MISMATCH,
        program.graph.hash,
        f"holds {real} bytes",
        f"declares {real + 1}",
    )


def test_tensor_declares_another_storage_size(conn: Conn, program: pb.Program) -> None:
    ref = program.state_dict[0]
    ref.storage.size_bytes = 63
    conn.fails(
        lambda: conn.partition(program),
        Code.DATA_LOSS,
        Reason.SIZE_MISMATCH,
        ref.storage.hash,
        "holds 64 bytes",
        "declares 63",
    )


def test_program_names_a_graph_never_uploaded(conn: Conn, program: pb.Program) -> None:
    missing = codec.digest_of(_unique())
    program.graph.CopyFrom(missing)
    _, meta = conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.BLOB_MISSING,
        missing.hash,
        "missing",
        "upload it",
    )
    assert meta[BLOB_DIGEST] == missing.hash


@pytest.mark.parametrize("rpc", list(HOOK_RPCS))
def test_program_names_a_tensor_never_uploaded(conn: Conn, program: pb.Program, rpc: str) -> None:
    missing = codec.digest_of(_unique(64))
    program.state_dict[0].storage.CopyFrom(missing)
    _, meta = conn.fails(
        _hook_call(conn, rpc, "xnnpack", program),
        Code.FAILED_PRECONDITION,
        Reason.BLOB_MISSING,
        missing.hash,
    )
    assert meta[BLOB_DIGEST] == missing.hash


# --- 5. fingerprint mismatch ----------------------------------------------------------------


def _node_fp(program: pb.Program, name: str) -> pb.NodeFingerprint:
    (f,) = [f for f in program.fingerprint if f.name == name]
    return f


def test_tampered_args(conn: Conn, program: pb.Program) -> None:
    f = _node_fp(program, "aten_add_tensor")
    assert f.args == "(%aten_addmm_default, %x,){}"
    f.args = "(%x, %x,){}"
    message, _ = conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        "'aten_add_tensor'",
        "args differs",
        "%x, %x",
    )
    assert "%aten_addmm_default" in message


def test_tampered_target(conn: Conn, program: pb.Program) -> None:
    f = _node_fp(program, "aten_add_tensor")
    assert f.target == "edge.aten.add.Tensor"
    f.target = "edge.aten.sub.Tensor"
    conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        "'aten_add_tensor'",
        "target differs",
        "edge.aten.sub.Tensor",
        "edge.aten.add.Tensor",
    )


def test_tampered_kwarg_names(conn: Conn, program: pb.Program) -> None:
    f = _node_fp(program, "aten_addmm_default")
    f.kwarg_names.append("beta")
    conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        "'aten_addmm_default'",
        "kwarg_names differs",
    )




@pytest.mark.parametrize(
    "name",
    [
        "p_linear_weight",
        "p_linear_bias",
        "x",
        "aten_permute_copy_default",
        "aten_addmm_default",
        "aten_add_tensor",
    ],
)
def test_dropped_node(conn: Conn, program: pb.Program, name: str) -> None:
    names = [f.name for f in program.fingerprint]
    i = names.index(name)
    assert i < len(names) - 1  # the last node: test_dropped_last_node
    del program.fingerprint[i]
    conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        f"node #{i}",
        "name differs",
        repr(name),
    )


def test_dropped_last_node(conn: Conn, program: pb.Program) -> None:
    n = len(program.fingerprint)
    assert program.fingerprint[-1].name == "output"
    del program.fingerprint[-1]
    conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        f"client has {n - 1}, server rebuilt {n}",
        "on the server",
        "'output'",
    )


def test_extra_node(conn: Conn, program: pb.Program) -> None:
    extra = program.fingerprint.add()
    extra.CopyFrom(_node_fp(program, "aten_add_tensor"))
    extra.name = "phantom"
    conn.fails(
        lambda: conn.partition(program),
        Code.FAILED_PRECONDITION,
        Reason.FINGERPRINT_MISMATCH,
        "on the client",
        "'phantom'",
    )


def test_fingerprint_mismatch_through_client(
    conn: Conn, edge_ep: ExportedProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = codec.fingerprint

    def tampered(ep: ExportedProgram) -> list[pb.NodeFingerprint]:
        out = real(ep)
        for f in out:
            if f.name == "aten_add_tensor":
                f.target = "edge.aten.sub.Tensor"
        return out

    monkeypatch.setattr(encode, "fingerprint", tampered)  # what encode_program sends
    remote = RemotePartitioner(conn.target, "xnnpack")
    try:
        with pytest.raises(FingerprintMismatchError) as excinfo:
            remote.partition(edge_ep)
    finally:
        remote.close()
    e = excinfo.value
    assert (e.code, e.reason) == (Code.FAILED_PRECONDITION, Reason.FINGERPRINT_MISMATCH.value)
    assert "'aten_add_tensor'" in str(e) and "target differs" in str(e)
    assert not any("delegation_tag" in n.meta for n in edge_ep.graph.nodes)
    conn.assert_serving()


# --- 6. a hosted partitioner that raises ----------------------------------------------------


class PartitionerTestError(Exception):
    """Not a built-in exception: crosses as a RemotePartitionerError."""


LONG_MESSAGE = "no support for X: " + "x" * 8000


class RaisingPartitioner(Partitioner):
    """Delegates nothing; raises where ``fail`` says.

    fail: "partition" (ValueError), "custom" (PartitionerTestError), "key" (KeyError),
    "long" (ValueError with an 8 KB message), "ops" (RuntimeError from
    ops_to_not_decompose), "filter" (IndexError from the filter on node ``node``),
    "transform" (TypeError from transform_for_pre_decomposition), "constructor" (ValueError
    from the constructor), "bare" (an AssertionError without arguments from partition),
    "bare_filter" (the same from the filter on node ``node``), or "" (nothing).
    """

    def __init__(self, fail: str = "", node: str = "add") -> None:
        super().__init__({"fail": fail, "node": node})
        if fail == "constructor":
            raise ValueError("the constructor refuses X")
        self.fail = fail
        self.node = node

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        if self.fail == "partition":
            raise ValueError("no support for X")
        if self.fail == "custom":
            raise PartitionerTestError("custom failure on X")
        if self.fail == "key":
            raise KeyError("X")
        if self.fail == "long":
            raise ValueError(LONG_MESSAGE)
        if self.fail == "bare":
            raise AssertionError
        return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool]]:
        if self.fail == "ops":
            raise RuntimeError("cannot list the ops of X")

        def check(node: torch.fx.Node) -> bool:
            if self.fail == "filter" and node.name == self.node:
                raise IndexError(f"no index for node {node.name}")
            if self.fail == "bare_filter" and node.name == self.node:
                raise AssertionError
            return node.op == "call_function"

        return [], check

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        if self.fail == "transform":
            raise TypeError("cannot transform X")
        return exported_program


RAISER = HostedPartitioner(
    name="raiser",
    backend_id="NoBackend",
    spec_keys={
        "fail": SpecKey("fail", str, "", "where to raise"),
        "node": SpecKey("node", str, "add", "the node the filter raises on"),
    },
    factory=lambda spec: RaisingPartitioner(**spec),
    partitioner_class=RaisingPartitioner,
    description="raises on demand",
)


@pytest.fixture(scope="module")
def raiser() -> Iterator[Conn]:
    """An in-process server hosting only the raising test partitioner."""
    with inproc_server(registry=Registry([RAISER])) as (_, target):
        c = Conn(target)
        try:
            c.assert_serving()
            yield c
        finally:
            c.close()


def _remote(raiser: Conn, fail: str, **spec: str) -> RemotePartitioner:
    return RemotePartitioner(raiser.target, "raiser", {"fail": fail, **spec})


def _remote_raises(
    raiser: Conn, fail: str, call: Callable[[RemotePartitioner], Any]
) -> BaseException:
    remote = _remote(raiser, fail)
    try:
        with pytest.raises(BaseException) as excinfo:
            call(remote)
    finally:
        remote.close()
    raiser.assert_serving()
    return excinfo.value


@pytest.mark.parametrize(
    "fail, hook, exc_type, message",
    [
        ("partition", "partition", ValueError, "no support for X"),
        ("ops", "ops_to_not_decompose", RuntimeError, "cannot list the ops of X"),
        ("transform", "transform_for_pre_decomposition", TypeError, "cannot transform X"),
    ],
)
def test_raised_builtin_exception_crosses(
    raiser: Conn,
    aten_ep: ExportedProgram,
    edge_ep: ExportedProgram,
    fail: str,
    hook: str,
    exc_type: type[Exception],
    message: str,
) -> None:
    ep = edge_ep if hook == "partition" else aten_ep
    e = _remote_raises(raiser, fail, lambda r: getattr(r, hook)(ep))
    assert type(e) is exc_type
    assert str(e) == message
    assert e.args == (message,)
    # What the local partitioner raises.
    with pytest.raises(exc_type) as local:
        getattr(RaisingPartitioner(fail), hook)(ep)
    assert (type(local.value), str(local.value)) == (type(e), str(e))


@pytest.mark.parametrize(
    "rpc, fail, exc_type, message",
    [
        ("Partition", "partition", "ValueError", "no support for X"),
        ("OpsToNotDecompose", "ops", "RuntimeError", "cannot list the ops of X"),
        ("TransformForPreDecomposition", "transform", "TypeError", "cannot transform X"),
        ("Partition", "custom", "PartitionerTestError", "custom failure on X"),
    ],
)
def test_raised_exception_on_the_wire(
    raiser: Conn,
    aten_ep: ExportedProgram,
    edge_ep: ExportedProgram,
    rpc: str,
    fail: str,
    exc_type: str,
    message: str,
) -> None:
    encoded = codec.encode_program(edge_ep if rpc == "Partition" else aten_ep)
    raiser.upload(encoded.blobs.values())
    spec = [_entry("fail", string_value=fail)]
    _, meta = raiser.fails(
        _hook_call(raiser, rpc, "raiser", encoded.message, spec),
        Code.INVALID_ARGUMENT,
        Reason.PARTITIONER_RAISED,
        "the hosted partitioner raised",
        f"{exc_type}: {message}",
    )
    assert meta[EXCEPTION_TYPE] == exc_type
    assert meta[EXCEPTION_MESSAGE] == message
    tb = meta[EXCEPTION_TRACEBACK]
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith(f"{exc_type}: {message}")
    assert __file__.rsplit("/", 1)[-1] in tb  # the frame of the test partitioner


@pytest.mark.parametrize(
    "fail, hook",
    [
        ("partition", "partition"),
        ("ops", "ops_to_not_decompose"),
        ("transform", "transform_for_pre_decomposition"),
    ],
)
def test_raised_exception_chains_remote_traceback(
    raiser: Conn, aten_ep: ExportedProgram, edge_ep: ExportedProgram, fail: str, hook: str
) -> None:
    ep = edge_ep if hook == "partition" else aten_ep
    e = _remote_raises(raiser, fail, lambda r: getattr(r, hook)(ep))
    assert isinstance(e.__cause__, RemoteTraceback)
    assert "Traceback (most recent call last):" in e.__cause__.tb
    assert f"in {hook}" in e.__cause__.tb


def test_raised_custom_exception(raiser: Conn, edge_ep: ExportedProgram) -> None:
    e = _remote_raises(raiser, "custom", lambda r: r.partition(edge_ep))
    assert type(e) is RemotePartitionerError
    assert str(e).startswith("PartitionerTestError: ")
    assert str(e) == "PartitionerTestError: custom failure on X"
    assert e.reason == Reason.PARTITIONER_RAISED.value


def test_filter_raises_on_exactly_that_node(raiser: Conn, aten_ep: ExportedProgram) -> None:
    local_ops, local_check = RaisingPartitioner("filter", "add").ops_to_not_decompose(aten_ep)
    remote = _remote(raiser, "filter", node="add")
    try:
        ops, check = remote.ops_to_not_decompose(aten_ep)
    finally:
        remote.close()
    assert ops == local_ops
    assert check is not None
    raised, answered = [], {}
    for node in aten_ep.graph.nodes:
        try:
            expected = local_check(node)
        except IndexError as local_error:
            with pytest.raises(IndexError) as excinfo:
                check(node)
            assert type(excinfo.value) is IndexError
            assert str(excinfo.value) == str(local_error) == "no index for node add"
            cause = excinfo.value.__cause__
            assert isinstance(cause, RemoteTraceback)
            assert "IndexError: no index for node add" in cause.tb
            raised.append(node.name)
        else:
            answered[node.name] = check(node)
            assert answered[node.name] is expected
    assert raised == ["add"]
    assert answered == {
        "p_linear_weight": False,
        "p_linear_bias": False,
        "x": False,
        "linear": True,
        "output": False,
    }
    raiser.assert_serving()


def test_filter_failure_on_the_wire(raiser: Conn, aten_ep: ExportedProgram) -> None:
    encoded = codec.encode_program(aten_ep)
    raiser.upload(encoded.blobs.values())
    ref = pb.PartitionerRef(name="raiser", spec=[_entry("fail", string_value="filter")])
    r = raiser.stub.OpsToNotDecompose(
        pb.OpsToNotDecomposeRequest(partitioner=ref, program=encoded.message),
        timeout=RPC_TIMEOUT,
    )
    assert r.has_filter and list(r.ops) == []
    assert [(n.graph, n.name) for n in r.supported] == [("", "linear")]
    (failure,) = r.failures
    assert (failure.node.graph, failure.node.name) == ("", "add")
    assert failure.exception.type == "IndexError"
    assert failure.exception.message == "no index for node add"
    assert "IndexError: no index for node add" in failure.exception.traceback
    raiser.assert_serving()


@pytest.mark.parametrize(
    "fail, exc_type",
    [
        ("partition", ValueError),
        ("filter", IndexError),
        ("ops", RuntimeError),
        ("transform", TypeError),
        # Raised without arguments: args () remotely too, not ("",).
        ("bare", AssertionError),
        ("bare_filter", AssertionError),
    ],
)
def test_local_and_remote_lowering_raise_alike(
    raiser: Conn, fail: str, exc_type: type[Exception]
) -> None:
    """to_edge_transform_and_lower raises the same with the local and the remote partitioner."""
    with pytest.raises(exc_type) as local:
        to_edge_transform_and_lower(_export(), partitioner=[RaisingPartitioner(fail)])
    remote_partitioner = _remote(raiser, fail)
    try:
        with pytest.raises(exc_type) as remote:
            to_edge_transform_and_lower(_export(), partitioner=[remote_partitioner])
    finally:
        remote_partitioner.close()
    assert type(remote.value) is type(local.value) is exc_type
    assert str(remote.value) == str(local.value)
    assert remote.value.args == local.value.args
    raiser.assert_serving()


def test_raised_key_error_keeps_its_message(raiser: Conn, edge_ep: ExportedProgram) -> None:
    e = _remote_raises(raiser, "key", lambda r: r.partition(edge_ep))
    with pytest.raises(KeyError) as local:
        RaisingPartitioner("key").partition(edge_ep)
    assert type(e) is KeyError
    assert str(e) == str(local.value) == "'X'"
    assert e.args == local.value.args == ("X",)


def test_raised_long_message_crosses(raiser: Conn, edge_ep: ExportedProgram) -> None:
    e = _remote_raises(raiser, "long", lambda r: r.partition(edge_ep))
    assert type(e) is ValueError
    assert str(e) == LONG_MESSAGE


def test_raising_constructor(raiser: Conn, edge_ep: ExportedProgram) -> None:
    encoded = codec.encode_program(edge_ep)
    raiser.upload(encoded.blobs.values())
    spec = [_entry("fail", string_value="constructor")]
    _, meta = raiser.fails(
        lambda: raiser.partition(encoded.message, "raiser", spec),
        Code.INVALID_ARGUMENT,
        Reason.PARTITIONER_RAISED,
        "the constructor refuses X",
    )
    assert meta[EXCEPTION_TYPE] == "ValueError"
