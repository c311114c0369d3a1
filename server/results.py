"""The server's result cache: hook responses by the content of the request that produced them.

Every hook RPC is a pure function of its request (the partitioner's name and spec, and a
program named by content: its graph and tensors are blobs addressed by SHA-256) and of the
server's versions. A response is therefore reusable for any later request with the same bytes,
from any client: the second lowering of a model skips decoding and partitioning.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from google.protobuf.message import Message


class ResultCache:
    """Serialized responses keyed by (RPC, request bytes, versions); least recently used
    evicted past ``max_bytes``. ``max_bytes=0`` disables it.

    Only successful responses are stored. A response is stored as bytes, so a hit returns a
    fresh message that the caller may change.
    """

    def __init__(self, max_bytes: int = 256 << 20, versions: str = "") -> None:
        self.max_bytes = max_bytes
        self._versions = versions.encode()
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: Lookups answered from the cache, and lookups that were not.
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of responses held."""
        return self._bytes

    def key(self, rpc: str, request: Message) -> str:
        """The cache key of ``request`` to ``rpc``: a digest of its deterministic bytes."""
        h = hashlib.sha256(self._versions)
        h.update(b"\0" + rpc.encode() + b"\0")
        h.update(request.SerializeToString(deterministic=True))
        return h.hexdigest()

    def get(self, key: str, response_type: type[Message]) -> Message | None:
        """The response stored under ``key`` as a new ``response_type``, or None."""
        with self._lock:
            data = self._entries.get(key)
            if data is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        response = response_type()
        response.ParseFromString(data)
        return response

    def put(self, key: str, response: Message) -> None:
        """Store ``response`` under ``key`` (a response larger than the cache is not kept)."""
        data = response.SerializeToString(deterministic=True)
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._entries[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)
