"""``client.blobs.upload_missing``: the one find-missing-then-upload both clients use, against a
real server (which checks every chunk's digest and offset), with each call recorded."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
import pytest
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.client.blobs import CHUNK_BYTES, upload_missing
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.blobstore import BlobStore


class _Recorder:
    """A ``call`` for upload_missing that makes the real call and records, in order, each
    call's method and every ``UploadBlobsRequest`` sent as (hash, offset, data)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sent: list[tuple[str, int, bytes]] = []

    def __call__(self, method: Callable[..., Any], request: Any) -> Any:
        if isinstance(request, pb.FindMissingBlobsRequest):
            self.calls.append("FindMissingBlobs")
            return method(request, timeout=60)
        self.calls.append("UploadBlobs")
        return method(self._recorded(request), timeout=60)

    def _recorded(self, requests: Iterable[pb.UploadBlobsRequest]
                  ) -> Iterator[pb.UploadBlobsRequest]:
        for r in requests:
            self.sent.append((r.digest.hash, r.offset, bytes(r.data)))
            yield r


@pytest.fixture()
def served() -> Iterator[tuple[BlobStore, pb_grpc.RemotePartitionerStub]]:
    """A fresh server in this process: its blob store and a stub."""
    store = BlobStore()
    with inproc_server(blob_store=store) as (_, target), grpc.insecure_channel(target) as ch:
        yield store, pb_grpc.RemotePartitionerStub(ch)


def _hold(stub: pb_grpc.RemotePartitionerStub, data: bytes) -> None:
    stub.UploadBlobs(iter([pb.UploadBlobsRequest(digest=digest_of(data), data=data)]),
                     timeout=60)


def test_uploads_only_what_is_missing_and_reports_progress(
    served: tuple[BlobStore, pb_grpc.RemotePartitionerStub],
) -> None:
    store, stub = served
    big, small, empty = b"x" * CHUNK_BYTES + b"tail!", b"small", b""
    digests = [digest_of(b) for b in (big, small, empty)]
    blobs = {d.hash: b for d, b in zip(digests, (big, small, empty), strict=True)}
    _hold(stub, small)
    call = _Recorder()
    seen: list[int] = []
    uploaded = upload_missing(call, stub, digests, blobs, seen.append)
    assert [d.hash for d in uploaded] == [digests[0].hash, digests[2].hash]
    assert call.calls == ["FindMissingBlobs", "UploadBlobs"]
    # What the client sent: the big blob in two chunks at their offsets, the empty one as one
    # empty message, each under its own digest; nothing of the blob the server held.
    assert call.sent == [
        (digests[0].hash, 0, big[:CHUNK_BYTES]),
        (digests[0].hash, CHUNK_BYTES, big[CHUNK_BYTES:]),
        (digests[2].hash, 0, b""),
    ]
    # The server, which refuses a chunk at a wrong offset or bytes that do not hash to their
    # digest, holds them.
    assert store.get(digests[0].hash) == big and store.get(digests[2].hash) == b""
    assert not stub.FindMissingBlobs(pb.FindMissingBlobsRequest(digests=digests),
                                     timeout=60).missing_digests
    assert sum(seen) == len(big) + len(small) and len(small) in seen


def test_nothing_missing_nothing_uploaded(
    served: tuple[BlobStore, pb_grpc.RemotePartitionerStub],
) -> None:
    _, stub = served
    d = digest_of(b"held")
    _hold(stub, b"held")
    call = _Recorder()
    seen: list[int] = []
    assert upload_missing(call, stub, [d], {}, seen.append) == []
    assert call.calls == ["FindMissingBlobs"] and seen == [4]
    assert upload_missing(call, stub, [], {}) == []
    assert call.calls == ["FindMissingBlobs"] and call.sent == []
