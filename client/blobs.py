"""Content-addressed blob upload, shared by ``RemotePartitioner`` and the ``Lower`` client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

#: Bytes per upload chunk: well under gRPC's 4 MiB default message limit.
CHUNK_BYTES = 1 << 20


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
