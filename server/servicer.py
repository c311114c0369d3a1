"""The gRPC servicer: translates between v1 messages and plain Python, nothing more.

Every failure becomes a ``google.rpc.Status`` with an ``ErrorInfo`` (domain
``remote-partitioner``, a reason from :mod:`remote_partitioner.proto.errors`); the server keeps
serving after each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import metadata
from typing import NoReturn, TypeVar

import grpc
import torch
from executorch.exir.backend.partitioner import Partitioner
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.errors import (
    BLOB_DIGEST,
    DOMAIN,
    EXCEPTION_MESSAGE,
    EXCEPTION_TRACEBACK,
    EXCEPTION_TYPE,
    EXPECTED_TYPE,
    SPEC_KEY,
    Reason,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server import hooks
from remote_partitioner.server.blobstore import BlobError, BlobStore, DigestMismatch, check_digest
from remote_partitioner.server.registry import (
    InvalidSpecError,
    Registry,
    UnknownPartitionerError,
)

logger = logging.getLogger(__name__)
_R = TypeVar("_R")

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


def abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    reason: Reason,
    message: str,
    info: Mapping[str, str] | None = None,
) -> NoReturn:
    """End the call with a ``google.rpc.Status`` carrying an ``ErrorInfo``."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason.value, domain=DOMAIN, metadata=info))
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=message, details=[detail]
    )
    context.abort_with_status(rpc_status.to_status(status))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


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


def _spec_value(value: object) -> pb.SpecValue | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return pb.SpecValue(bool_value=value)
    if isinstance(value, int):
        return pb.SpecValue(int_value=value)
    if isinstance(value, float):
        return pb.SpecValue(double_value=value)
    if isinstance(value, str):
        return pb.SpecValue(string_value=value)
    if isinstance(value, bytes):
        return pb.SpecValue(bytes_value=value)
    return None


def _backend_module(backend_id: str) -> str:
    """The module defining the ``BackendDetails`` subclass named ``backend_id``, or ""."""
    from executorch.exir.backend.backend_details import BackendDetails

    for cls in BackendDetails.__subclasses__():
        if cls.__name__ == backend_id:
            return cls.__module__
    return ""


class RemotePartitionerServicer(pb_grpc.RemotePartitionerServicer):
    """Implements ``remote_partitioner.v1.RemotePartitioner`` over a registry and blob store."""

    def __init__(self, registry: Registry, blobs: BlobStore) -> None:
        self.registry = registry
        self.blobs = blobs
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
                default = _spec_value(key.default)
                if default is not None:
                    k.default.CopyFrom(default)
        return response

    # ------------------------------------------------------------------ blobs

    def FindMissingBlobs(
        self, request: pb.FindMissingBlobsRequest, context: grpc.ServicerContext
    ) -> pb.FindMissingBlobsResponse:
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
                self.blobs.put(current.hash, current.size_bytes, bytes(buf))
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
                self._check_digest(d, context)
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
        return self._run(request.partitioner, request.program, context, hooks.partition)

    def OpsToNotDecompose(
        self, request: pb.OpsToNotDecomposeRequest, context: grpc.ServicerContext
    ) -> pb.OpsToNotDecomposeResponse:
        return self._run(request.partitioner, request.program, context, hooks.ops_to_not_decompose)

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

        return self._run(request.partitioner, request.program, context, transform)

    # ------------------------------------------------------------------ helpers

    def _check_digest(self, d: pb.Digest, context: grpc.ServicerContext) -> None:
        try:
            check_digest(d.hash, d.size_bytes)
        except BlobError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_DIGEST, str(e))

    def _abort_raised(self, context: grpc.ServicerContext, r: pb.RemoteException) -> NoReturn:
        # The full message and traceback travel once, in the ErrorInfo; the status message
        # is a summary, so that the trailers stay within gRPC's metadata limits.
        summary = r.message if len(r.message) <= 512 else r.message[:512] + "..."
        abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.PARTITIONER_RAISED,
              f"the hosted partitioner raised {r.type}: {summary}",
              {EXCEPTION_TYPE: r.type, EXCEPTION_MESSAGE: r.message,
               EXCEPTION_TRACEBACK: r.traceback})

    def _run(
        self,
        ref: pb.PartitionerRef,
        program: pb.Program,
        context: grpc.ServicerContext,
        hook: Callable[[Partitioner, ExportedProgram], _R],
    ) -> _R:
        """Build the partitioner, decode the program, run ``hook``; map failures to statuses."""
        try:
            hosted = self.registry.get(ref.name)
        except UnknownPartitionerError as e:
            abort(context, grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_PARTITIONER, str(e))
        try:
            partitioner = hosted.create(spec_from_message(ref.spec))
        except DuplicateSpecKey as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_SPEC, str(e))
        except InvalidSpecError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_SPEC, str(e),
                  {SPEC_KEY: e.key, EXPECTED_TYPE: e.expected})
        except Exception as e:  # the partitioner's own constructor refused the spec
            self._abort_raised(context, hooks.remote_exception(e))

        def blob(d: pb.Digest) -> bytes:
            data = self.blobs.get(d.hash)
            if data is None:
                raise codec.BlobMissing(d)
            return data

        with self._hook_lock:
            try:
                ep = codec.decode_program(program, blob)
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
            try:
                return hook(partitioner, ep)
            except hooks.PartitionerRaised as e:
                self._abort_raised(context, e.remote)
            except (codec.UnrepresentableMeta, codec.ProgramEncodeError) as e:
                abort(context, grpc.StatusCode.INTERNAL, Reason.UNREPRESENTABLE_RESULT, str(e))


__all__ = ["RemotePartitionerServicer", "abort", "server_versions", "spec_from_message"]
