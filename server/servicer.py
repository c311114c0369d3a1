"""The gRPC servicer: translates between v1 messages and plain Python, nothing more.

Every failure becomes a ``google.rpc.Status`` with an ``ErrorInfo`` (domain
``remote-partitioner``, a reason from :mod:`remote_partitioner.proto.errors`); the server keeps
serving after each.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any, NoReturn, TypeVar

import grpc
import torch
from executorch.exir.backend.partitioner import Partitioner
from google.protobuf.message import DecodeError, Message
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.errors import (
    BLOB_DIGEST,
    EXCEPTION_MESSAGE,
    EXCEPTION_TRACEBACK,
    EXCEPTION_TYPE,
    EXPECTED_TYPE,
    SPEC_KEY,
    Reason,
)
from remote_partitioner.proto.spec import spec_value
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server import hooks
from remote_partitioner.server.blobstore import (
    BlobError,
    Blobs,
    BlobView,
    DigestMismatch,
    check_digest,
)
from remote_partitioner.server.registry import (
    InvalidSpecError,
    Registry,
    UnknownPartitionerError,
)
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.settings import Limits
from remote_partitioner.server.status import abort, bad_request, retry_info

logger = logging.getLogger(__name__)
_M = TypeVar("_M", bound=Message)
_HookRequest = (
    pb.PartitionRequest | pb.OpsToNotDecomposeRequest | pb.TransformForPreDecompositionRequest
)
_RESPONSES: dict[str, type[Message]] = {
    "Partition": pb.PartitionResponse,
    "OpsToNotDecompose": pb.OpsToNotDecomposeResponse,
    "TransformForPreDecomposition": pb.TransformForPreDecompositionResponse,
}
_MAX_WAIT = 7 * 24 * 3600.0

READ_CHUNK_BYTES = 1 << 20
_SPEC_TYPES = {
    bool: pb.SPEC_TYPE_BOOL,
    int: pb.SPEC_TYPE_INT,
    float: pb.SPEC_TYPE_DOUBLE,
    str: pb.SPEC_TYPE_STRING,
    bytes: pb.SPEC_TYPE_BYTES,
}
_HOOKS = {
    "partition": pb.HOOK_PARTITION,
    "ops_to_not_decompose": pb.HOOK_OPS_TO_NOT_DECOMPOSE,
    "transform_for_pre_decomposition": pb.HOOK_TRANSFORM_FOR_PRE_DECOMPOSITION,
}


def server_versions() -> pb.ServerVersions:
    """The versions that decide whether this server reproduces a local lowering."""
    from torch._export.serde.schema import SCHEMA_VERSION

    return pb.ServerVersions(
        torch=torch.__version__,
        executorch=metadata.version("executorch"),
        export_schema=".".join(map(str, SCHEMA_VERSION)),
        api="v1",
        server=metadata.version("remote-partitioner"),
    )


class DuplicateSpecKey(ValueError):
    """A spec key appears twice in a request."""


def spec_from_message(spec: Iterable[pb.SpecEntry]) -> dict[str, object]:
    """Spec entries -> plain Python values, in order (an unset value is None, which
    validation refuses).

    Raises:
        DuplicateSpecKey: a key appears twice.
    """
    out: dict[str, object] = {}
    for entry in spec:
        if entry.key in out:
            raise DuplicateSpecKey(f"spec key {entry.key!r} appears more than once")
        kind = entry.value.WhichOneof("value")
        out[entry.key] = getattr(entry.value, kind) if kind else None
    return out



def _backend_module(backend_id: str) -> str:
    """The module defining the ``BackendDetails`` subclass named ``backend_id``, or ""."""
    from executorch.exir.backend.backend_details import BackendDetails

    for cls in BackendDetails.__subclasses__():
        if cls.__name__ == backend_id:
            return cls.__module__
    return ""


class RemotePartitionerServicer(pb_grpc.RemotePartitionerServicer):
    """Implements ``remote_partitioner.v1.RemotePartitioner`` over a registry and blob store."""

    def __init__(
        self,
        registry: Registry,
        blobs: Blobs,
        limits: Limits | None = None,
        results: ResultCache | None = None,
    ) -> None:
        self.registry = registry
        self.blobs = blobs
        self.limits = limits or Limits()
        self.results = results if results is not None else ResultCache(0)
        self._admitted = threading.BoundedSemaphore(self.limits.max_concurrent_hooks)
        # ExecuTorch partitioners and fake tensor modes share process-wide state: hooks run one
        # at a time per process (scale with worker processes).
        self._hook_lock = threading.Lock()

    # ------------------------------------------------------------------ discovery

    def ListPartitioners(
        self, request: pb.ListPartitionersRequest, context: grpc.ServicerContext
    ) -> pb.ListPartitionersResponse:
        response = pb.ListPartitionersResponse(versions=server_versions())
        for name in self.registry.names():
            hosted = self.registry.get(name)
            info = response.partitioners.add(
                name=hosted.name,
                backend_id=hosted.backend_id,
                class_name=f"{hosted.partitioner_class.__module__}."
                f"{hosted.partitioner_class.__qualname__}",
                description=hosted.description,
                overridden_hooks=[_HOOKS[h] for h in hosted.overridden_hooks()],
                backend_module=_backend_module(hosted.backend_id),
            )
            for key in hosted.spec_keys.values():
                k = info.spec_keys.add(name=key.name, type=_SPEC_TYPES[key.type], doc=key.doc)
                if key.default is not None:
                    k.default.CopyFrom(spec_value(key.name, key.default))
        return response

    # ------------------------------------------------------------------ blobs

    def FindMissingBlobs(
        self, request: pb.FindMissingBlobsRequest, context: grpc.ServicerContext
    ) -> pb.FindMissingBlobsResponse:
        self._check_count(context, len(request.digests))
        missing = []
        for d in request.digests:
            self._check_digest(d, context)
            if not self.blobs.has(d.hash, d.size_bytes):
                missing.append(d)
        return pb.FindMissingBlobsResponse(missing_digests=missing)

    def UploadBlobs(
        self, request_iterator: Iterable[pb.UploadBlobsRequest], context: grpc.ServicerContext
    ) -> pb.UploadBlobsResponse:
        committed: list[pb.Digest] = []
        current: pb.Digest | None = None
        buf = bytearray()

        def commit() -> None:
            assert current is not None
            try:
                self.blobs.put(current.hash, current.size_bytes, buf)  # handed over, no copy
            except DigestMismatch as e:
                abort(context, grpc.StatusCode.DATA_LOSS, Reason.DIGEST_MISMATCH, str(e),
                      {BLOB_DIGEST: current.hash})
            committed.append(current)

        for chunk in request_iterator:
            d = chunk.digest
            if current is None or d.hash != current.hash or d.size_bytes != current.size_bytes:
                if current is not None:
                    abort(
                        context, grpc.StatusCode.DATA_LOSS, Reason.INCOMPLETE_BLOB,
                        f"blob {current.hash} ended after {len(buf)} of {current.size_bytes} "
                        "bytes", {BLOB_DIGEST: current.hash},
                    )
                self._check_digest(d, context, "digest")
                current, buf = pb.Digest(hash=d.hash, size_bytes=d.size_bytes), bytearray()
            if chunk.offset != len(buf):
                abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_CHUNK,
                    f"blob {d.hash}: chunk at offset {chunk.offset}, expected {len(buf)}",
                    {BLOB_DIGEST: d.hash},
                )
            if len(buf) + len(chunk.data) > current.size_bytes:
                abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_CHUNK,
                    f"blob {d.hash}: chunks exceed the declared size {current.size_bytes}",
                    {BLOB_DIGEST: d.hash},
                )
            buf += chunk.data
            if len(buf) == current.size_bytes:
                commit()
                current, buf = None, bytearray()
        if current is not None:
            abort(
                context, grpc.StatusCode.DATA_LOSS, Reason.INCOMPLETE_BLOB,
                f"stream ended after {len(buf)} of {current.size_bytes} bytes of blob "
                f"{current.hash}", {BLOB_DIGEST: current.hash},
            )
        return pb.UploadBlobsResponse(committed_digests=committed)

    def ReadBlobs(
        self, request: pb.ReadBlobsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ReadBlobsResponse]:
        self._check_count(context, len(request.digests))
        for d in request.digests:
            self._check_digest(d, context)
            data = self.blobs.get(d.hash)
            if data is None or len(data) != d.size_bytes:
                abort(context, grpc.StatusCode.NOT_FOUND, Reason.BLOB_NOT_FOUND,
                      f"blob {d.hash}/{d.size_bytes} is not held", {BLOB_DIGEST: d.hash})
            view = memoryview(data)
            if not data:
                yield pb.ReadBlobsResponse(digest=d, offset=0, data=b"")
            for off in range(0, len(data), READ_CHUNK_BYTES):
                yield pb.ReadBlobsResponse(
                    digest=d, offset=off, data=bytes(view[off : off + READ_CHUNK_BYTES])
                )

    # ------------------------------------------------------------------ hooks

    def Partition(
        self, request: pb.PartitionRequest, context: grpc.ServicerContext
    ) -> pb.PartitionResponse:
        return self._run("Partition", request, context, hooks.partition)

    def OpsToNotDecompose(
        self, request: pb.OpsToNotDecomposeRequest, context: grpc.ServicerContext
    ) -> pb.OpsToNotDecomposeResponse:
        return self._run("OpsToNotDecompose", request, context, hooks.ops_to_not_decompose)

    def TransformForPreDecomposition(
        self, request: pb.TransformForPreDecompositionRequest, context: grpc.ServicerContext
    ) -> pb.TransformForPreDecompositionResponse:
        def transform(
            partitioner: Partitioner, ep: ExportedProgram
        ) -> pb.TransformForPreDecompositionResponse:
            out = hooks.transform_for_pre_decomposition(partitioner, ep)
            if out is None:
                return pb.TransformForPreDecompositionResponse(unchanged=True)
            encoded = codec.encode_program(out)
            for h, data in encoded.blobs.items():
                raw = bytes(data)
                self.blobs.put(h, len(raw), raw)
            return pb.TransformForPreDecompositionResponse(program=encoded.message)

        return self._run("TransformForPreDecomposition", request, context, transform)

    # ------------------------------------------------------------------ helpers

    def _check_digest(
        self, d: pb.Digest, context: grpc.ServicerContext, field: str = "digests"
    ) -> None:
        try:
            check_digest(d.hash, d.size_bytes)
        except BlobError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_DIGEST, str(e),
                  details=[bad_request(field, str(e))])
        if d.size_bytes > self.limits.max_blob_bytes:
            self._limit(context, field, f"blob {d.hash} declares {d.size_bytes} bytes",
                        self.limits.max_blob_bytes)

    def _limit(self, context: grpc.ServicerContext, field: str, what: str, bound: int) -> NoReturn:
        message = f"{what}, over this server's limit of {bound}"
        abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.LIMIT_EXCEEDED, message,
              details=[bad_request(field, message)])

    def _check_count(self, context: grpc.ServicerContext, n: int) -> None:
        if n > self.limits.max_digests:
            self._limit(context, "digests", f"{n} digests", self.limits.max_digests)

    def _check_program(self, program: pb.Program, context: grpc.ServicerContext) -> None:
        """Bound a program by what it declares, before any of it is decoded."""
        limits = self.limits
        if program.graph.size_bytes > limits.max_graph_bytes:
            self._limit(context, "program.graph.size_bytes",
                        f"the graph declares {program.graph.size_bytes} bytes",
                        limits.max_graph_bytes)
        nodes, total = 0, 0
        seen: set[str] = set()
        stack = [program]
        while stack:
            p = stack.pop()
            nodes += len(p.fingerprint)
            for d in codec.iter_digests(p, nested=False):
                if d.hash not in seen:
                    seen.add(d.hash)
                    total += max(d.size_bytes, 0)
            stack.extend(m.original_program for m in p.lowered_modules)
        if nodes > limits.max_nodes:
            self._limit(context, "program.fingerprint", f"the program has {nodes} nodes",
                        limits.max_nodes)
        if total > limits.max_program_bytes:
            self._limit(context, "program", f"the program names {total} bytes of blobs",
                        limits.max_program_bytes)

    def _abort_raised(self, context: grpc.ServicerContext, r: pb.RemoteException) -> NoReturn:
        # The full message and traceback travel once, in the ErrorInfo; the status message
        # is a summary, so that the trailers stay within gRPC's metadata limits.
        summary = r.message if len(r.message) <= 512 else r.message[:512] + "..."
        abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.PARTITIONER_RAISED,
              f"the hosted partitioner raised {r.type}: {summary}",
              {EXCEPTION_TYPE: r.type, EXCEPTION_MESSAGE: r.message,
               EXCEPTION_TRACEBACK: r.traceback})

    def _partitioner(self, ref: pb.PartitionerRef, context: grpc.ServicerContext) -> Partitioner:
        """Build the hosted partitioner ``ref`` names; map failures to statuses."""
        try:
            hosted = self.registry.get(ref.name)
        except UnknownPartitionerError as e:
            abort(context, grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_PARTITIONER, str(e))
        try:
            return hosted.create(spec_from_message(ref.spec))
        except DuplicateSpecKey as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_SPEC, str(e))
        except InvalidSpecError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_SPEC, str(e),
                  {SPEC_KEY: e.key, EXPECTED_TYPE: e.expected},
                  [bad_request(f"partitioner.spec[{e.key}]", str(e))])
        except Exception as e:  # the partitioner's own constructor refused the spec
            self._abort_raised(context, hooks.remote_exception(e))

    @contextlib.contextmanager
    def _turn(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Admit the call (or refuse it as OVERLOADED with RetryInfo), then wait for the
        process's one hook slot until the call's deadline (DEADLINE_EXCEEDED if it passes)."""
        if not self._admitted.acquire(blocking=False):
            delay = self.limits.retry_after_seconds
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED,
                  f"{self.limits.max_concurrent_hooks} hook calls are already in progress; "
                  f"retry in {delay:g} s", details=[retry_info(delay)])
        try:
            remaining = context.time_remaining()
            # No deadline shows as None or as a remaining time too large for a lock timeout.
            wait = -1.0 if remaining is None or remaining > _MAX_WAIT else max(remaining, 0.0)
            if not self._hook_lock.acquire(timeout=wait):
                abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, Reason.DEADLINE_PASSED,
                      "the deadline passed while the call waited for its turn")
            try:
                yield
            finally:
                self._hook_lock.release()
        finally:
            self._admitted.release()

    def _check_deadline(self, context: grpc.ServicerContext) -> None:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, Reason.DEADLINE_PASSED,
                  "the deadline passed before the work could start")

    def _blob(self, d: pb.Digest) -> BlobView:
        data = self.blobs.get(d.hash)
        if data is None:
            raise codec.BlobMissing(d)
        return data

    def _run(
        self,
        rpc: str,
        request: _HookRequest,
        context: grpc.ServicerContext,
        hook: Callable[[Partitioner, ExportedProgram], _M],
    ) -> _M:
        """Build the partitioner, decode the program, run ``hook``; map failures to statuses.

        A request whose bytes were answered before, and whose blobs (and the answer's) are
        all still held, is answered from the result cache, without a turn.
        """
        partitioner = self._partitioner(request.partitioner, context)
        program = self._program(request, context)
        self._check_program(program, context)
        key = self.results.key(rpc, request)
        if self._held(codec.iter_digests(program)):
            cached = self.results.get(key, _RESPONSES[rpc])
            if cached is not None and self._held(_response_digests(cached)):
                return cached  # type: ignore[return-value]
        with self._turn(context):
            ep = self._decode(program, context)
            self._check_deadline(context)
            try:
                response = hook(partitioner, ep)
            except hooks.PartitionerRaised as e:
                self._abort_raised(context, e.remote)
            except (codec.UnrepresentableMeta, codec.ProgramEncodeError) as e:
                abort(context, grpc.StatusCode.INTERNAL, Reason.UNREPRESENTABLE_RESULT, str(e))
        self.results.put(key, response)
        return response

    def _program(self, request: _HookRequest, context: grpc.ServicerContext) -> pb.Program:
        """The request's program: inline, or read from the ``program_digest`` blob."""
        if not request.HasField("program_digest"):
            return request.program
        if request.HasField("program"):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PROGRAM,
                  "set program or program_digest, not both",
                  details=[bad_request("program_digest", "program is set too")])
        d = request.program_digest
        self._check_digest(d, context, "program_digest")
        if d.size_bytes > self.limits.max_graph_bytes:
            self._limit(context, "program_digest", f"the program message declares "
                        f"{d.size_bytes} bytes", self.limits.max_graph_bytes)
        data = self._required_blob(d, "program", context)
        program = pb.Program()
        try:
            program.ParseFromString(bytes(data))
        except DecodeError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PROGRAM,
                  f"blob {d.hash} is not a Program message: {e}")
        return program

    def _required_blob(
        self, d: pb.Digest, what: str, context: grpc.ServicerContext
    ) -> BlobView:
        """The blob a request names directly, or FAILED_PRECONDITION / BLOB_MISSING."""
        data = self.blobs.get(d.hash)
        if data is None or len(data) != d.size_bytes:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, Reason.BLOB_MISSING,
                  f"{what} blob {d.hash}/{d.size_bytes} is missing; upload it and call again",
                  {BLOB_DIGEST: d.hash})
        return data

    def _held(self, digests: Iterable[pb.Digest]) -> bool:
        return all(self.blobs.has(d.hash, d.size_bytes) for d in digests)

    def _decode(self, program: pb.Program, context: grpc.ServicerContext) -> ExportedProgram:
        try:
            return codec.decode_program(program, self._blob)
        except codec.BlobMissing as e:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, Reason.BLOB_MISSING,
                  f"{e}; upload it and call again", {BLOB_DIGEST: e.digest.hash})
        except codec.FingerprintMismatch as e:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                  Reason.FINGERPRINT_MISMATCH, str(e))
        except codec.BlobSizeMismatch as e:
            abort(context, grpc.StatusCode.DATA_LOSS, Reason.SIZE_MISMATCH, str(e))
        except codec.ProgramDecodeError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PROGRAM,
                  f"the program cannot be decoded: {e}")
        except Exception as e:
            logger.exception("decoding a program failed")
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PROGRAM,
                  f"the program cannot be decoded: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ whole lowering

    def Lower(
        self, request: pb.LowerRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.LowerResponse]:
        from remote_partitioner.server import lowering, pt2

        if not request.partitioners:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_SPEC,
                  "no partitioner given", details=[bad_request("partitioners", "empty")])
        partitioners = [self._partitioner(ref, context) for ref in request.partitioners]
        self._check_digest(request.archive, context, "archive")
        with self._turn(context):
            archive = self._required_blob(request.archive, "archive", context)
            try:
                programs = pt2.read_pt2(memoryview(archive))
            except (ValueError, codec.CodecError) as e:
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PROGRAM,
                      f"the archive cannot be read: {e}")
            self._check_deadline(context)
            try:
                methods, pte = lowering.lower(
                    programs, partitioners,
                    check_ir_validity=not request.options.skip_ir_validity_check,
                    report_only=request.options.report_only,
                )
            except hooks.PartitionerRaised as e:
                self._abort_raised(context, e.remote)
        first = pb.LowerResponse(report=_report_message(methods))
        if pte is not None:
            first.pte.CopyFrom(codec.digest_of(pte))
        yield first
        view = memoryview(pte or b"")
        for off in range(0, len(view), READ_CHUNK_BYTES):
            yield pb.LowerResponse(offset=off, data=bytes(view[off : off + READ_CHUNK_BYTES]))


def _response_digests(response: Message) -> Iterator[pb.Digest]:
    """The blobs a hook response names (a transformed program's)."""
    if isinstance(response, pb.TransformForPreDecompositionResponse) and response.HasField(
        "program"
    ):
        yield from codec.iter_digests(response.program)


def _report_message(methods: Iterable[Any]) -> pb.DelegationReport:
    """``lowering.MethodReport``s as a DelegationReport message."""
    out = pb.DelegationReport()
    for m in methods:
        entry = out.methods.add(method=m.method, total_nodes=m.total_nodes)
        for backend, (partitions, nodes) in sorted(m.delegated.items()):
            entry.delegated.add(backend_id=backend, partitions=partitions, nodes=nodes)
        for op, count in sorted(m.cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])):
            entry.cpu_ops.add(op=op, count=count)
    return out


__all__ = ["Limits", "RemotePartitionerServicer", "server_versions", "spec_from_message"]
