"""Content-addressed blob upload, shared by ``RemotePartitioner`` and the ``Lower`` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

#: Bytes per upload chunk: well under gRPC's 4 MiB default message limit.
CHUNK_BYTES = 1 << 20

#: How a client makes one call: ``call(stub_method, request)`` returns the response, with the
#: client's own deadline, metadata and error mapping (it raises what the client raises).
Call = Callable[[Callable[..., Any], Any], Any]


def upload_requests(
    missing: Sequence[pb.Digest],
    blobs: Mapping[str, memoryview | bytes],
    progress: Callable[[int], None] | None = None,
) -> Iterator[pb.UploadBlobsRequest]:
    """The ``UploadBlobs`` stream for ``missing``: each blob in consecutive chunks of
    :data:`CHUNK_BYTES` from offset 0, an empty blob as one empty chunk. ``progress`` is called
    with the size of each chunk as it is sent."""
    for d in missing:
        data = memoryview(blobs[d.hash])
        if data.nbytes == 0:
            yield pb.UploadBlobsRequest(digest=d, offset=0, data=b"")
        for off in range(0, data.nbytes, CHUNK_BYTES):
            piece = data[off : off + CHUNK_BYTES]
            yield pb.UploadBlobsRequest(digest=d, offset=off, data=piece.tobytes())
            if progress is not None:
                progress(piece.nbytes)


def upload_missing(
    call: Call,
    stub: pb_grpc.RemotePartitionerStub,
    digests: Sequence[pb.Digest],
    blobs: Mapping[str, memoryview | bytes],
    progress: Callable[[int], None] | None = None,
) -> list[pb.Digest]:
    """Ask the server which of ``digests`` it lacks (``FindMissingBlobs``) and upload those
    (one ``UploadBlobs`` stream); return the digests uploaded, empty if none was missing.

    ``blobs`` maps the hash of each digest the server may lack to its bytes. ``call`` makes
    each of the (at most two) calls. ``progress``, if given, is called with the size of each
    chunk as it is sent and, once, with the total size of the blobs the server already held,
    so that its calls add up to the size of all of ``digests``. With no ``digests`` nothing is
    called.

    Raises:
        whatever ``call`` raises for a failed call.
    """
    if not digests:
        return []
    missing = list(
        call(stub.FindMissingBlobs, pb.FindMissingBlobsRequest(digests=digests)).missing_digests
    )
    if progress is not None:
        lacked = {d.hash for d in missing}
        held = sum(d.size_bytes for d in digests if d.hash not in lacked)
        if held:
            progress(held)
    if missing:
        call(stub.UploadBlobs, upload_requests(missing, blobs, progress))
    return missing
