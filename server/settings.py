"""The server's settings and their defaults; light to import (the command line reads them
before anything heavy is loaded). :data:`DEFAULT_ADDRESS`, where ``serve`` listens unless told
otherwise, is :data:`remote_partitioner.proto.transport.DEFAULT_ADDRESS`, re-exported."""

from __future__ import annotations

import dataclasses

from remote_partitioner.proto.transport import DEFAULT_ADDRESS

__all__ = ["DEFAULT_ADDRESS", "Limits"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask of the server. Past a bound, a call ends with
    RESOURCE_EXHAUSTED (reason ``LIMIT_EXCEEDED``, with a ``BadRequest`` naming the field);
    past ``max_concurrent_hooks`` calls at once, with reason ``OVERLOADED`` and a
    ``RetryInfo``. Declared sizes are checked before anything is allocated for them."""

    #: Largest blob, in bytes.
    max_blob_bytes: int = 4 << 30
    #: Largest graph JSON blob of one program, in bytes.
    max_graph_bytes: int = 1 << 30
    #: Largest program: the bytes of all the blobs it names, nested programs included.
    max_program_bytes: int = 64 << 30
    #: Most nodes in one program, over all its graphs.
    max_nodes: int = 2_000_000
    #: Most digests in one FindMissingBlobs or ReadBlobs request.
    max_digests: int = 1_000_000
    #: Most hook calls (Partition, OpsToNotDecompose, TransformForPreDecomposition) admitted
    #: at once by one server process; they run one at a time, the others wait.
    max_concurrent_hooks: int = 16
    #: The delay RetryInfo suggests to a call refused as OVERLOADED.
    retry_after_seconds: float = 1.0
    #: Most upload bytes in flight in one server process (declared sizes of the blobs being
    #: received); a new blob past it is refused as OVERLOADED with a RetryInfo, unless it is
    #: the only one in flight.
    max_inflight_bytes: int = 2 << 30
    #: Seconds a stream may go without a message in either direction (an upload that sends no
    #: chunk, a reader that takes none) before it is cancelled with DEADLINE_EXCEEDED
    #: (reason ``STREAM_IDLE``); the partial blob is discarded.
    stream_idle_seconds: float = 60.0
