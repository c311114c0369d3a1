"""Uploads in plain Python: one ``UploadBlobs`` stream's reassembly (:class:`UploadAssembly`)
and the bound on the upload bytes a server holds in flight (:class:`ByteBudget`)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable

from remote_partitioner.proto.errors import BLOB_DIGEST, Reason, ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server.blobstore import BlobBuffer, Blobs, DigestMismatch


@dataclasses.dataclass(frozen=True)
class CompleteBlob:
    """A blob whose last chunk arrived: its digest and its bytes, not yet verified."""

    digest: pb.Digest
    data: BlobBuffer
    #: The SHA-256 (hex) of the bytes, computed chunk by chunk as they arrived; empty if not.
    sha256: str = ""


class ByteBudget:
    """Bytes of uploads in flight, bounded: a blob reserves its declared size when its first
    chunk arrives and gives it back when it is stored or dropped.

    A reservation past ``max_bytes`` is refused (OVERLOADED, with a retry delay) unless
    nothing else is in flight, so that a blob larger than the bound still passes alone.
    Thread-safe.
    """

    def __init__(self, max_bytes: int, retry_after: float) -> None:
        self.max_bytes = max_bytes
        self.retry_after = retry_after
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes reserved now."""
        return self._used

    def reserve(self, n: int, what: str) -> None:
        """Reserve ``n`` bytes for ``what``.

        Raises:
            ServiceError: OVERLOADED, the reservation would pass the bound.
        """
        with self._lock:
            if self._used and self._used + n > self.max_bytes:
                raise ServiceError(
                    Reason.OVERLOADED,
                    f"{what} ({n} bytes) would take the uploads in flight on this server past "
                    f"{self.max_bytes} bytes; retry in {self.retry_after:g} s",
                    retry_after=self.retry_after,
                )
            self._used += n

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes."""
        with self._lock:
            self._used -= n


class UploadAssembly:
    """Reassembles one ``UploadBlobs`` stream: chunks in order, blob after blob.

    Contract: call :meth:`feed` with each request in order; when it returns a
    :class:`CompleteBlob`, call :meth:`commit` with it (it stores the blob: the async servicer
    runs it off the event loop); at the end call :meth:`finish`. Each chunk is hashed as it is
    fed, so that the blob is verified as soon as its last chunk arrives, rather than hashed
    whole after it while the client waits. A refusal raises
    :class:`~remote_partitioner.proto.errors.ServiceError` and stores nothing of the blob in
    progress (blobs committed earlier in the stream stay stored: they were verified).
    """

    def __init__(
        self, blobs: Blobs, check_digest: Callable[[pb.Digest, str], None], inflight: ByteBudget
    ) -> None:
        self._blobs = blobs
        self._check_digest = check_digest
        self._inflight = inflight
        self.committed: list[pb.Digest] = []
        self._current: pb.Digest | None = None
        self._buf: BlobBuffer | None = None
        self._sha256 = hashlib.sha256()

    @property
    def pending(self) -> pb.Digest | None:
        """The blob being received, or None between blobs."""
        return self._current

    @property
    def pending_bytes(self) -> int:
        """Bytes of the blob in progress received so far."""
        return self._buf.written if self._buf is not None else 0

    def starts_blob(self, chunk: pb.UploadBlobsRequest) -> bool:
        """Whether ``chunk`` begins a new blob (rather than continuing the current one)."""
        cur, d = self._current, chunk.digest
        return cur is None or d.hash != cur.hash or d.size_bytes != cur.size_bytes

    def feed(self, chunk: pb.UploadBlobsRequest) -> CompleteBlob | None:
        """Take the next chunk; return the blob when this chunk completed it, else None.

        Raises:
            ServiceError: INVALID_DIGEST / LIMIT_EXCEEDED for a bad or too large declared
                digest; INCOMPLETE_BLOB when a new blob starts before the current one ended;
                BAD_CHUNK for an offset out of order or bytes past the declared size.
        """
        d = chunk.digest
        if self.starts_blob(chunk):
            if self._current is not None:
                raise self._incomplete(
                    f"blob {self._current.hash} ended after {self.pending_bytes} of "
                    f"{self._current.size_bytes} bytes"
                )
            self._check_digest(d, "digest")
            self._inflight.reserve(d.size_bytes, f"blob {d.hash}")
            self._buf = BlobBuffer(d.size_bytes)
            self._current = pb.Digest(hash=d.hash, size_bytes=d.size_bytes)
            self._sha256 = hashlib.sha256()
        current, buf = self._current, self._buf
        assert current is not None and buf is not None
        if chunk.offset != buf.written:
            raise ServiceError(
                Reason.BAD_CHUNK,
                f"blob {d.hash}: chunk at offset {chunk.offset}, expected {buf.written}",
                {BLOB_DIGEST: d.hash},
            )
        data = chunk.data  # (each read of a bytes field is a copy)
        if buf.written + len(data) > current.size_bytes:
            raise ServiceError(
                Reason.BAD_CHUNK,
                f"blob {d.hash}: chunks exceed the declared size {current.size_bytes}",
                {BLOB_DIGEST: d.hash},
            )
        buf.append(data)
        self._sha256.update(data)
        if buf.written < current.size_bytes:
            return None
        done = CompleteBlob(current, buf, self._sha256.hexdigest())
        self._current, self._buf = None, None
        self._inflight.release(current.size_bytes)
        return done

    def commit(self, blob: CompleteBlob) -> None:
        """Verify and store a completed blob (its buffer is handed to the store, no copy).
        The hash computed as its chunks arrived verifies it when it matches; otherwise the
        store hashes the bytes and says why it refuses them.

        Raises:
            ServiceError: DIGEST_MISMATCH, the bytes do not hash to the digest.
        """
        hashed = blob.sha256 == blob.digest.hash  # (an empty digest hash is never valid)
        try:
            self._blobs.put(blob.digest.hash, blob.digest.size_bytes, blob.data, hashed=hashed)
        except DigestMismatch as e:
            raise ServiceError(
                Reason.DIGEST_MISMATCH, str(e), {BLOB_DIGEST: blob.digest.hash}
            ) from e
        finally:
            blob.data.close()
        self.committed.append(blob.digest)

    def finish(self) -> pb.UploadBlobsResponse:
        """The stream ended: the response naming every blob stored.

        Raises:
            ServiceError: INCOMPLETE_BLOB, the stream ended inside a blob.
        """
        if self._current is not None:
            raise self._incomplete(
                f"stream ended after {self.pending_bytes} of {self._current.size_bytes} bytes "
                f"of blob {self._current.hash}"
            )
        return pb.UploadBlobsResponse(committed_digests=self.committed)

    def discard(self) -> None:
        """Drop the blob in progress (the stream was cancelled, idle or refused); idempotent."""
        if self._current is not None:
            self._inflight.release(self._current.size_bytes)
        if self._buf is not None:
            self._buf.close()
        self._current, self._buf = None, None

    def _incomplete(self, message: str) -> ServiceError:
        assert self._current is not None
        error = ServiceError(Reason.INCOMPLETE_BLOB, message, {BLOB_DIGEST: self._current.hash})
        self.discard()
        return error


__all__ = ["ByteBudget", "CompleteBlob", "UploadAssembly"]
