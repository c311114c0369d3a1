"""Whole-program lowering on the server (the ``Lower`` RPC), for archives from any exporter."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import grpc

from remote_partitioner.client.blobs import upload_missing
from remote_partitioner.client.channel import open_channel
from remote_partitioner.client.errors import RemotePartitionerError, from_rpc_error
from remote_partitioner.proto import errors
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.spec import SpecScalar, spec_entries
from remote_partitioner.proto.transport import ENVIRONMENT_METADATA_KEY
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc


@dataclasses.dataclass
class LowerResult:
    """What ``Lower`` returned: the delegation report and the ``.pte`` (None if report-only)."""

    report: pb.DelegationReport
    #: The ``.pte`` (None if report-only, or written to the file ``lower`` was given).
    pte: bytes | None
    #: The ``.pte``'s digest, as the server sent it and the bytes received matched (None if
    #: report-only).
    pte_digest: pb.Digest | None = None
    #: The ``.pte`` is the one the caller said it holds (``held_pte``): no bytes were sent,
    #: ``pte`` is None and nothing was written to ``into``.
    pte_held: bool = False


def partitioner_ref(name: str, spec: Mapping[str, SpecScalar] | None = None) -> pb.PartitionerRef:
    """A PartitionerRef for ``name`` with ``spec`` (its order kept)."""
    return pb.PartitionerRef(name=name, spec=spec_entries(spec))


class LowerClient:
    """Uploads a PT2 archive and lowers it on the server.

    Args:
        target: a gRPC target string.
        credentials: TLS channel credentials; None for plaintext.
        token: bearer token sent as ``authorization: Bearer <token>``.
        timeout: deadline of each call, in seconds.
        max_retries: how many times a call the server refused as busy (``OVERLOADED``, an
            upload past its in-flight bound or a lowering past its queue) is made again, each
            after the delay its ``RetryInfo`` names (at most
            :data:`~remote_partitioner.client.errors.MAX_RETRY_DELAY_S`).
        request_id: sent as ``x-request-id`` with every call (the server logs it); None
            sends none and the server picks one.

    A lowering's calls (its upload and ``Lower``) carry the header
    ``x-remote-partitioner-environment`` when the listing places its partitioners in a named
    environment (one ``ListPartitioners`` call per client, on first use), so that the front
    door routes them to that environment's server.
    """

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        timeout: float | None = None,
        max_retries: int = 5,
        request_id: str | None = None,
    ) -> None:
        self.channel = open_channel(target, credentials)
        self.max_retries = max_retries
        #: Calls made again after the server said it was busy.
        self.overloaded_retries = 0
        self.stub = pb_grpc.RemotePartitionerStub(self.channel)
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        ) + ((("x-request-id", request_id),) if request_id else ())
        self.timeout = timeout
        self._listing: pb.ListPartitionersResponse | None = None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> LowerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: Callable[..., Any], request: Any,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Any:
        try:
            return method(request, timeout=self.timeout,
                          metadata=self.metadata if metadata is None else metadata)
        except grpc.RpcError as e:
            exc = from_rpc_error(e)
        raise exc from exc.__cause__

    def list_partitioners(self) -> pb.ListPartitionersResponse:
        """The server's hosted partitioners and versions (every environment's, when the
        server has peers); asked each time."""
        self._listing = self._call(self.stub.ListPartitioners, pb.ListPartitionersRequest())
        return self._listing

    def environment_of(self, partitioners: Sequence[pb.PartitionerRef]) -> str:
        """The environment that hosts ``partitioners`` ("" for the default one; names the
        listing does not know are left to the server to refuse).

        Raises:
            RemotePartitionerError: (INVALID_ARGUMENT) they are hosted in different
                environments, which no one server can lower together.
        """
        listing = self._listing if self._listing is not None else self.list_partitioners()
        where = {p.name: p.environment for p in listing.partitioners}
        envs = {where[p.name] for p in partitioners if p.name in where}
        if len(envs) > 1:
            named = ", ".join(f"{p.name} ({where[p.name] or 'default'})"
                              for p in partitioners if p.name in where)
            raise RemotePartitionerError(
                f"the partitioners are hosted in different environments: {named}; one "
                "lowering runs in one environment", grpc.StatusCode.INVALID_ARGUMENT,
            )
        return envs.pop() if envs else listing.environment

    def _metadata_for(self, environment: str) -> tuple[tuple[str, str], ...]:
        if not environment:
            return self.metadata
        return (*self.metadata, (ENVIRONMENT_METADATA_KEY, environment))

    def upload(
        self, data: bytes | memoryview, progress: Callable[[int], None] | None = None,
        digest: pb.Digest | None = None, environment: str = "",
    ) -> pb.Digest:
        """Upload ``data`` as a blob unless the server (of ``environment``, "" for the
        default one) holds it; return its digest (``digest``, if the caller computed it
        already)."""
        if digest is None:
            digest = digest_of(data)
        metadata = self._metadata_for(environment)
        upload_missing(lambda m, r: self._call(m, r, metadata), self.stub, [digest],
                       {digest.hash: data}, progress)
        return digest

    def lower(
        self,
        archive: bytes | memoryview,
        partitioners: Sequence[pb.PartitionerRef],
        *,
        report_only: bool = False,
        skip_ir_validity_check: bool = False,
        upload_progress: Callable[[int], None] | None = None,
        into: IO[bytes] | None = None,
        archive_digest: pb.Digest | None = None,
        held_pte: pb.Digest | None = None,
    ) -> LowerResult:
        """Upload ``archive`` (a ``torch.export.save`` file) and lower it with
        ``partitioners``; verify the ``.pte`` against the digest the server sent.

        ``into``: a seekable file open for writing, to which the ``.pte`` is written as it
        arrives, rather than kept in memory (``LowerResult.pte`` is then None). It holds the
        whole, verified ``.pte`` only when this returns: the caller discards it otherwise.

        ``archive_digest``: the archive's digest, when the caller knows it (else it is
        computed here). ``held_pte``: the digest of a ``.pte`` the caller holds; when the
        lowering's ``.pte`` is that one, its bytes are not sent (``LowerResult.pte_held``).

        Raises:
            RemotePartitionerError: (or a subclass, or the exception lowering raised on the
                server) the call failed, or the ``.pte`` does not match its digest.
        """
        options = pb.LowerOptions(
            report_only=report_only, skip_ir_validity_check=skip_ir_validity_check
        )
        missing, waits, progress = 0, 0, upload_progress
        environment = self.environment_of(partitioners)
        # (computed once, whatever the retries)
        digest = archive_digest if archive_digest is not None else digest_of(archive)
        start = into.tell() if into is not None else 0
        while True:
            try:
                self.upload(archive, progress, digest, environment)
                progress = None  # (reported once)
                request = pb.LowerRequest(
                    archive=digest, partitioners=partitioners, options=options,
                    held_pte=held_pte,
                )
                return self._receive(request, into, self._metadata_for(environment))
            except RemotePartitionerError as e:
                if into is not None:
                    into.seek(start)
                    into.truncate()
                if missing == 0 and e.reason == errors.Reason.BLOB_MISSING:
                    missing += 1
                    continue  # evicted between upload and call
                if e.retry_delay is not None and waits < self.max_retries:
                    waits += 1  # the server is busy and said when to come back
                    self.overloaded_retries += 1
                    e.wait_as_told()
                    continue
                raise

    def _receive(
        self, request: pb.LowerRequest, into: IO[bytes] | None,
        metadata: tuple[tuple[str, str], ...],
    ) -> LowerResult:
        first: pb.LowerResponse | None = None
        parts: list[bytes] = []
        size = 0
        sha256 = hashlib.sha256()  # fed as the chunks arrive, between them
        try:
            for message in self.stub.Lower(request, timeout=self.timeout, metadata=metadata):
                if first is None:
                    first = message
                data = message.data  # (each read of a bytes field is a copy: one here)
                if data and not request.options.report_only:
                    if message.offset != size:
                        raise RemotePartitionerError(
                            f"the .pte chunk at {message.offset} arrived, expected {size}"
                        )
                    if size + len(data) > first.pte.size_bytes:
                        raise RemotePartitionerError(
                            f"the .pte is longer than its digest's {first.pte.size_bytes} bytes",
                            grpc.StatusCode.DATA_LOSS,
                        )
                    if into is None:
                        parts.append(data)
                    else:
                        into.write(data)
                    sha256.update(data)
                    size += len(data)
        except grpc.RpcError as e:
            exc = from_rpc_error(e)
            raise exc from exc.__cause__
        if first is None:
            raise RemotePartitionerError("the server sent no response")
        if request.options.report_only:
            return LowerResult(first.report, None)
        held = request.held_pte if request.HasField("held_pte") else None
        if (size == 0 and held is not None and first.HasField("pte")
                and (first.pte.hash, first.pte.size_bytes) == (held.hash, held.size_bytes)):
            return LowerResult(first.report, None, first.pte, pte_held=True)
        if sha256.hexdigest() != first.pte.hash or size != first.pte.size_bytes:
            raise RemotePartitionerError(
                "the .pte received does not match the digest the server sent",
                grpc.StatusCode.DATA_LOSS,
            )
        return LowerResult(first.report, b"".join(parts) if into is None else None, first.pte)
