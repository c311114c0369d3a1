"""The connection a remote client object (``RemotePartitioner``, ``RemoteQuantizer``) keeps to a
server: the channel and stub, the calls with their retries, and a program's way to the server
(encoded, its missing blobs uploaded, referred to by digest, its tensors withheld until a hook
needs them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any, TypeVar

import grpc
import torch
from torch.export import ExportedProgram

from remote_partitioner.client.blobs import upload_missing
from remote_partitioner.client.channel import (
    AFFINITY_METADATA_KEY,
    default_channel_options,
    new_affinity_key,
    open_channel,
)
from remote_partitioner.client.errors import (
    IncompatibleServerError,
    RemotePartitionerError,
    from_rpc_error,
)
from remote_partitioner.proto import codec, errors
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.transport import ENVIRONMENT_METADATA_KEY
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

_Entry = TypeVar("_Entry", pb.PartitionerInfo, pb.QuantizerInfo)


class _Snapshot:
    """What a hook's answer depends on, held cheaply: the program's objects by identity (its
    graph modules, nodes, every ``node.meta`` value, tensors with their version counters,
    signature, constraints) and its structural fingerprint (node names, ops, targets, args).

    Two snapshots are equal when the program is the same object, none of those was replaced
    and no tensor was written in place since: then encoding it again would give the same
    message, and the server the same answer. (A ``node.meta`` value changed in place, rather
    than replaced, is not seen: no ExecuTorch pass between two hook calls does that.)
    """

    __slots__ = ("_fingerprint", "_objects", "_versions")

    def __init__(self, ep: ExportedProgram) -> None:
        objects: list[object] = [
            ep, ep.graph_module, ep.graph_signature, ep.range_constraints, ep.module_call_graph,
        ]
        for _, gm in codec.graph_modules(ep.graph_module):
            objects.append(gm)
            for node in gm.graph.nodes:
                objects.append(node)
                objects.extend(node.meta.keys())
                objects.extend(node.meta.values())
        tensors = [*ep.state_dict.values(), *ep.constants.values()]
        objects.extend(tensors)
        self._objects = objects
        self._versions = [t._version if isinstance(t, torch.Tensor) else None for t in tensors]
        self._fingerprint = codec.fingerprint(ep)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Snapshot)
            and len(self._objects) == len(other._objects)
            and all(a is b for a, b in zip(self._objects, other._objects, strict=True))
            and self._versions == other._versions
            and self._fingerprint == other._fingerprint
        )

    __hash__ = None  # type: ignore[assignment]


def _local_versions() -> dict[str, str]:
    return {"torch": torch.__version__, "executorch": metadata.version("executorch")}


def apply_rng_state(response: Any) -> None:
    """Set this process's CPU generator to the state the remote hook left, if it drew."""
    if response.rng_state:
        set_rng_state(response.rng_state)


def set_rng_state(raw: bytes) -> None:
    """Set this process's CPU generator to the raw state ``raw``
    (``torch.get_rng_state()``'s bytes)."""
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def environment_info(listing: pb.ListPartitionersResponse, name: str) -> pb.EnvironmentInfo:
    """Environment ``name``'s versions and what it accepts withheld, as ``listing`` (a
    ``ListPartitioners`` answer) states them: the answering server's own when ``name`` is its
    environment, else the peer's ``EnvironmentInfo``.

    Raises:
        RemotePartitionerError: (UNAVAILABLE) the listing names the environment but could not
            list it; (NOT_FOUND) it does not name it.
    """
    if name == listing.environment:
        return pb.EnvironmentInfo(
            name=name, versions=listing.versions,
            accepts_withheld_tensors=listing.accepts_withheld_tensors,
            accepts_withheld_lowered_programs=listing.accepts_withheld_lowered_programs,
        )
    for env in listing.environments:
        if env.name == name:
            if env.error:
                raise RemotePartitionerError(
                    f"environment {name!r} is not available: {env.error}",
                    grpc.StatusCode.UNAVAILABLE,
                )
            return env
    raise RemotePartitionerError(
        f"the listing names no environment {name!r}", grpc.StatusCode.NOT_FOUND
    )


def listed_entry(
    listing: pb.ListPartitionersResponse, entries: Iterable[_Entry], name: str, target: str,
    kind: str, error: type[RemotePartitionerError], reason: errors.Reason,
) -> _Entry:
    """The entry of ``entries`` (a listing's partitioners or quantizers) named ``name``.

    Raises:
        RemotePartitionerError: ``error`` (NOT_FOUND, with ``reason``) naming what the server
            at ``target`` hosts of this ``kind``, and the environments ``listing`` could not
            list (the entry may be theirs).
    """
    for entry in entries:
        if entry.name == name:
            return entry
    names = ", ".join(e.name for e in entries) or "none"
    unavailable = "".join(f"; environment {e.name} is not available: {e.error}"
                          for e in listing.environments if e.error)
    raise error(
        f"server at {target} hosts no {kind} {name!r}; hosted: {names}{unavailable}",
        grpc.StatusCode.NOT_FOUND,
        reason.value,
    )


class ServerConnection:
    """A client object's connection to one server (see the module doc).

    Args:
        target: any gRPC target string: ``host:port``, ``ipv4:a:p1,b:p2``, ``dns:///name:port``.
        timeout: per-call deadline in seconds; None waits as long as the call takes.
        channel: an existing channel to use instead of opening one to ``target``.
        credentials: channel credentials for TLS; None opens an insecure channel.
        options: extra channel options.
        check_versions: refuse a server whose torch or ExecuTorch version differs from ours.
        token: a bearer token, sent as ``authorization: Bearer <token>`` metadata on every call.
        max_retries: how many times a call refused with a ``RetryInfo`` is retried after the
            delay the server asks for, and a call that failed with UNAVAILABLE made again.
        memoize: answer a call made again on the same, unchanged program object from the
            previous answer.
        withhold_tensors: send programs without their tensors' data first (see
            ``RemotePartitioner``).

    Environments: when the listing places the hosted entry a connection is for (a subclass's
    :meth:`_entry_environment`) in a named environment, every call but ``ListPartitioners``
    carries the header ``x-remote-partitioner-environment`` with that name, so that the front
    door routes it (and its blobs) to that environment's server, and the versions checked are
    that environment's.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        check_versions: bool = True,
        token: str | None = None,
        max_retries: int = 5,
        memoize: bool = True,
        withhold_tensors: bool = True,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.check_versions = check_versions
        self.max_retries = max_retries
        self.memoize = memoize
        self.withhold_tensors = withhold_tensors
        self._listing: pb.ListPartitionersResponse | None = None
        # The entry's environment, once known (see _environment_info)
        self._env_info: pb.EnvironmentInfo | None = None
        # hook RPC name -> (snapshot of the program, response, encoding, generator state sent)
        # of the last call
        self._memo: dict[str, tuple[_Snapshot, Any, codec.EncodedProgram, bytes]] = {}
        # One affinity key per object: its calls stay on one replica (see channel.py).
        self._metadata: tuple[tuple[str, str], ...] = (
            (AFFINITY_METADATA_KEY, new_affinity_key()),
            *((("authorization", f"Bearer {token}"),) if token else ()),
        )
        self._credentials = credentials
        self._options = list(options)  # after the defaults, built when the channel is
        self._owns_channel = channel is None
        self._channel = channel
        self._stub: pb_grpc.RemotePartitionerStub | None = None
        self._lock = threading.Lock()
        self._digests = codec.DigestCache()
        #: Counters: RPCs made, blobs and bytes uploaded, and of those the bytes that describe
        #: graphs (graph JSON and Program messages) and the bytes of tensor data (weights,
        #: buffers, constants); hook calls answered from memory; hook calls sent with their
        #: tensors withheld, and of those the ones the server answered TENSOR_DATA_REQUIRED
        #: (sent again with the data); lowered modules sent without their original programs
        #: (counted per encoding); hook calls made again after UNAVAILABLE (a replica
        #: went away), and after BLOB_MISSING although their blobs had been uploaded
        #: (evicted, or another replica answered), and after the server refused them as
        #: overloaded (RetryInfo: too many hook calls, or too many upload bytes in flight).
        self.stats: dict[str, int] = {
            "calls": 0, "blobs_uploaded": 0, "bytes_uploaded": 0,
            "graph_bytes_uploaded": 0, "tensor_bytes_uploaded": 0, "memo_hits": 0,
            "withheld_calls": 0, "tensor_data_requests": 0, "withheld_lowered_modules": 0,
            "unavailable_retries": 0, "blob_missing_retries": 0, "overloaded_retries": 0,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for k in ("_channel", "_stub", "_lock", "_digests", "_memo", "_listing", "_env_info"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._channel, self._stub = None, None
        self._owns_channel = True
        self._lock = threading.Lock()
        self._digests = codec.DigestCache()
        self._memo = {}
        self._listing = None
        self._env_info = None

    def close(self) -> None:
        """Close the channel this connection opened (not one it was given)."""
        if self._channel is not None and self._owns_channel:
            self._channel.close()
        self._channel, self._stub = None, None

    @property
    def stub(self) -> pb_grpc.RemotePartitionerStub:
        with self._lock:
            if self._stub is None:
                if self._channel is None:
                    self._channel = open_channel(
                        self.target, self._credentials,
                        [*default_channel_options(), *self._options],
                    )
                self._stub = pb_grpc.RemotePartitionerStub(self._channel)
            return self._stub

    def _rpc(self, method: Callable[..., Any], request: Any, *, listing: bool = False) -> Any:
        self.stats["calls"] += 1
        try:
            return method(request, timeout=self.timeout,
                          metadata=self._metadata if listing else self._call_metadata())
        except grpc.RpcError as e:
            exc = from_rpc_error(e)
        raise exc from exc.__cause__  # the remote traceback, if the server sent one

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata of every call but the listing: with the environment header when the
        entry's environment is a named one."""
        env = self._environment_info().name
        return (*self._metadata, (ENVIRONMENT_METADATA_KEY, env)) if env else self._metadata

    def _server_listing(self) -> pb.ListPartitionersResponse:
        """The server's ``ListPartitioners`` answer (fetched once, without the environment
        header: the front door's default environment lists every environment)."""
        if self._listing is None:
            self._listing = self._rpc(
                self.stub.ListPartitioners, pb.ListPartitionersRequest(), listing=True
            )
        return self._listing

    def _entry_environment(self) -> str:
        """The environment of the hosted entry this connection is for (subclasses look it up
        in the listing); this base class's: the answering server's."""
        return self._server_listing().environment

    def _environment_info(self) -> pb.EnvironmentInfo:
        """The entry's environment (name, versions), its torch and ExecuTorch versions
        checked against this process's (``check_versions``)."""
        if self._env_info is None:
            info = environment_info(self._server_listing(), self._entry_environment())
            if self.check_versions:
                local = _local_versions()
                remote = {"torch": info.versions.torch, "executorch": info.versions.executorch}
                if local != remote:
                    where = f" (environment {info.name})" if info.name else ""
                    raise IncompatibleServerError(
                        f"server at {self.target}{where} runs {remote}, this client {local}: "
                        "it cannot reproduce a local lowering (check_versions=False to use it "
                        "anyway)",
                        grpc.StatusCode.FAILED_PRECONDITION,
                    )
            self._env_info = info
        return self._env_info

    def _upload(
        self,
        blobs: Mapping[str, memoryview | bytes],
        digests: list[pb.Digest],
        graphs: set[str],
    ) -> None:
        missing = upload_missing(self._rpc, self.stub, digests, blobs)
        graph_bytes = sum(d.size_bytes for d in missing if d.hash in graphs)
        total = sum(d.size_bytes for d in missing)
        self.stats["blobs_uploaded"] += len(missing)
        self.stats["bytes_uploaded"] += total
        self.stats["graph_bytes_uploaded"] += graph_bytes
        self.stats["tensor_bytes_uploaded"] += total - graph_bytes

    def _call_hook(
        self, rpc: str, make: Callable[[pb.Digest], Any], ep: ExportedProgram
    ) -> tuple[Any, codec.EncodedProgram]:
        """Encode ``ep``, upload what the server lacks, call ``method`` (see
        :meth:`_encode_and_call`). A repeated call on the unchanged program is answered from
        memory."""
        # The caller's generator state goes with the call and the state the hook left comes
        # back, so that the process draws next what it would have after the local hook.
        rng = torch.get_rng_state().numpy().tobytes()
        snapshot = _Snapshot(ep) if self.memoize else None
        memo = self._memo.get(rpc)
        if memo is not None and memo[0] == snapshot and memo[3] == rng:
            self.stats["memo_hits"] += 1
            apply_rng_state(memo[1])
            return memo[1], memo[2]

        def make_with_rng(ref: pb.Digest) -> Any:
            request = make(ref)
            request.rng_state = rng
            return request

        method = getattr(self.stub, rpc)
        response: Any = None
        encoded: codec.EncodedProgram | None = None
        env = self._environment_info() if self.withhold_tensors else None
        if env is not None and env.accepts_withheld_tensors:
            # First without the tensors' data (and lowered modules' programs): most hooks
            # decide from the graph, shapes and dtypes, and the server notices exactly when
            # one does not.
            self.stats["withheld_calls"] += 1
            try:
                response, encoded = self._encode_and_call(
                    method, make_with_rng, ep, withhold=True,
                    withhold_lowered=env.accepts_withheld_lowered_programs,
                )
            except RemotePartitionerError as e:
                if e.reason != errors.Reason.TENSOR_DATA_REQUIRED:
                    raise
                self.stats["tensor_data_requests"] += 1
        if encoded is None:
            response, encoded = self._encode_and_call(method, make_with_rng, ep)
        if snapshot is not None:
            self._memo[rpc] = (snapshot, response, encoded, rng)
        apply_rng_state(response)
        return response, encoded

    def _encode_and_call(
        self,
        method: Callable[..., Any],
        make: Callable[[pb.Digest], Any],
        ep: ExportedProgram,
        *,
        withhold: bool = False,
        withhold_lowered: bool = False,
    ) -> tuple[Any, codec.EncodedProgram]:
        """Encode ``ep`` (its tensors' data withheld if ``withhold``, its lowered modules'
        programs if ``withhold_lowered`` too) and call ``method`` with
        the program's digest; on BLOB_MISSING upload what the server lacks and call again (up
        to three uploads: a blob can be evicted, or the call reach another replica, in
        between); on UNAVAILABLE (the replica went away) call again, up to ``max_retries``
        times with a growing pause, on the replica the channel fails over to."""
        encoded = self._encode(ep, withhold=withhold, withhold_lowered=withhold_lowered)
        self.stats["withheld_lowered_modules"] += sum(
            lm.original_withheld for lm in encoded.message.lowered_modules
        )
        # The program message itself crosses as a blob, so that a program the server has
        # seen before, from any client, costs one small request.
        program = encoded.message.SerializeToString(deterministic=True)
        ref = digest_of(program)
        blobs: dict[str, memoryview | bytes] = {**encoded.blobs, ref.hash: program}
        digests = [*encoded.digests(), ref]
        graphs = {d.hash for d in codec.graph_digests(encoded.message)} | {ref.hash}
        return self._call_with_blobs(method, lambda: make(ref), blobs, digests, graphs), encoded

    def _encode(
        self, ep: ExportedProgram, *, withhold: bool = False, withhold_lowered: bool = False
    ) -> codec.EncodedProgram:
        try:
            return codec.encode_program(
                ep, digests=self._digests, withhold=withhold, withhold_lowered=withhold_lowered
            )
        except codec.ProgramEncodeError as e:
            raise RemotePartitionerError(
                f"the program cannot be sent: {e}", grpc.StatusCode.INVALID_ARGUMENT,
                errors.Reason.INVALID_PROGRAM.value,
            ) from e

    def _call_with_blobs(
        self,
        method: Callable[..., Any],
        make: Callable[[], Any],
        blobs: Mapping[str, memoryview | bytes],
        digests: list[pb.Digest],
        graphs: set[str],
    ) -> Any:
        """Call ``method`` with ``make()``; on BLOB_MISSING upload what the server lacks of
        ``blobs`` and call again (see :meth:`_encode_and_call`)."""
        uploads, waits, failovers = 0, 0, 0
        upload = False  # first, ask as if the server held everything
        while True:
            try:
                if upload:
                    self._upload(blobs, digests, graphs)
                    uploads += 1
                return self._rpc(method, make())
            except RemotePartitionerError as e:
                if e.reason == errors.Reason.BLOB_MISSING and uploads < 3:
                    if upload:  # uploaded, yet missing: evicted, or another replica answered
                        self.stats["blob_missing_retries"] += 1
                    upload = True  # upload what it lacks
                    continue
                if e.code == grpc.StatusCode.UNAVAILABLE and failovers < self.max_retries:
                    # The replica went away (a call gRPC could not retry itself): every RPC is
                    # idempotent, so ask the replica the channel fails over to, uploading
                    # again if this call had to upload.
                    failovers += 1
                    self.stats["unavailable_retries"] += 1
                    time.sleep(min(0.05 * 2**failovers, 2.0))
                    continue
                if e.retry_delay is not None and waits < self.max_retries:
                    waits += 1  # the server is busy and said when to come back
                    self.stats["overloaded_retries"] += 1
                    e.wait_as_told()
                    continue
                raise

    def _read_blob(self, digest: pb.Digest) -> bytes:
        parts = []
        try:
            for chunk in self.stub.ReadBlobs(
                pb.ReadBlobsRequest(digests=[digest]), timeout=self.timeout,
                metadata=self._call_metadata(),
            ):
                parts.append(chunk.data)
        except grpc.RpcError as e:
            exc = from_rpc_error(e)
            raise exc from exc.__cause__
        return b"".join(parts)


__all__ = [
    "ServerConnection",
    "apply_rng_state",
    "environment_info",
    "listed_entry",
    "set_rng_state",
]
