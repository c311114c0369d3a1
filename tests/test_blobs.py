"""``client.blobs.upload_missing``: the one find-missing-then-upload both clients use."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from remote_partitioner.client.blobs import CHUNK_BYTES, upload_missing
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb


class _Stub:
    """Holds ``held`` blobs; records the calls made to it."""

    def __init__(self, held: Iterable[str]) -> None:
        self.held = set(held)
        self.calls: list[str] = []
        self.received: dict[str, bytes] = {}

    def FindMissingBlobs(self, request: pb.FindMissingBlobsRequest) -> Any:
        self.calls.append("FindMissingBlobs")
        return pb.FindMissingBlobsResponse(
            missing_digests=[d for d in request.digests if d.hash not in self.held])

    def UploadBlobs(self, requests: Iterable[pb.UploadBlobsRequest]) -> Any:
        self.calls.append("UploadBlobs")
        for r in requests:
            self.received[r.digest.hash] = self.received.get(r.digest.hash, b"") + r.data
        return pb.UploadBlobsResponse()


def _call(method: Callable[..., Any], request: Any) -> Any:
    return method(request)


def test_uploads_only_what_is_missing_and_reports_progress() -> None:
    big, small, empty = b"x" * (CHUNK_BYTES + 5), b"small", b""
    digests = [digest_of(b) for b in (big, small, empty)]
    blobs = {d.hash: b for d, b in zip(digests, (big, small, empty), strict=True)}
    stub = _Stub(held={digests[1].hash})
    seen: list[int] = []
    uploaded = upload_missing(_call, stub, digests, blobs, seen.append)  # type: ignore[arg-type]
    assert [d.hash for d in uploaded] == [digests[0].hash, digests[2].hash]
    assert stub.calls == ["FindMissingBlobs", "UploadBlobs"]
    assert stub.received == {digests[0].hash: big, digests[2].hash: b""}
    assert sum(seen) == len(big) + len(small) and len(small) in seen


def test_nothing_missing_nothing_uploaded() -> None:
    d = digest_of(b"held")
    stub = _Stub(held={d.hash})
    seen: list[int] = []
    assert upload_missing(_call, stub, [d], {}, seen.append) == []  # type: ignore[arg-type]
    assert stub.calls == ["FindMissingBlobs"] and seen == [4]
    assert upload_missing(_call, stub, [], {}) == []  # type: ignore[arg-type]
    assert stub.calls == ["FindMissingBlobs"]
