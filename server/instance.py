"""The service's logic in plain Python: no gRPC here.

:class:`PartitionerInstance` holds what a server serves with (the registry of hosted
partitioners, the blob store, the limits and the result cache) and implements each RPC of
``remote_partitioner.v1.RemotePartitioner`` as a method that takes and returns the contract's
messages. It owns admission control, the bounds on requests, the result-cache policy, chunk
reassembly (:mod:`remote_partitioner.server.uploads`), partitioner lookup and spec decoding.
Every refusal is a :class:`~remote_partitioner.proto.errors.ServiceError` whose reason decides
the status code (:data:`~remote_partitioner.proto.errors.STATUS_CODES`); the servicer only
translates.

Deadlines reach this layer as a ``time_remaining`` callable (seconds left, or None for no
deadline), so that it can refuse to start work whose caller has stopped waiting.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from executorch.exir.backend.partitioner import Partitioner
from google.protobuf.message import DecodeError, Message
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.errors import (
    BLOB_DIGEST,
    EXCEPTION_MESSAGE,
    EXCEPTION_TRACEBACK,
    EXCEPTION_TYPE,
    EXCEPTION_WITHOUT_ARGUMENTS,
    EXPECTED_TYPE,
    SPEC_KEY,
    TENSOR_NAME,
    TENSOR_USE,
    Reason,
    ServiceError,
)
from remote_partitioner.proto.spec import spec_value
from remote_partitioner.proto.transport import hook_to_wire
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server import caller_rng, hooks, value_reads
from remote_partitioner.server import preprocess as preprocess_runner
from remote_partitioner.server.backend_registry import (
    BackendRegistry,
    UnknownBackendError,
    default_backend_registry,
)
from remote_partitioner.server.blobstore import (
    BlobError,
    Blobs,
    BlobView,
    check_digest,
)
from remote_partitioner.server.observability import stdout_logged
from remote_partitioner.server.quantizers import (
    QuantizerRegistry,
    default_quantizers,
)
from remote_partitioner.server.registry import (
    InvalidSpecError,
    NamedRegistry,
    Registry,
    SpecKey,
)
from remote_partitioner.server.results import ResultCache
from remote_partitioner.server.settings import Limits
from remote_partitioner.server.uploads import ByteBudget, UploadAssembly
from remote_partitioner.server.versions import server_versions

if TYPE_CHECKING:
    from remote_partitioner.server.lower_call import Lowered

logger = logging.getLogger(__name__)
#: The logger of what backend code prints to stdout during a call (see ``turn``).
_BACKEND_OUTPUT = logging.getLogger("remote_partitioner.server.backend_output")

TimeRemaining = Callable[[], "float | None"]
"""Seconds left before the caller's deadline; None when it has none."""

_M = TypeVar("_M", bound=Message)
_T = TypeVar("_T")
HookRequest = (
    pb.PartitionRequest
    | pb.OpsToNotDecomposeRequest
    | pb.TransformForPreDecompositionRequest
    | pb.QuantizeRequest
)
_RESPONSES: dict[str, type[Message]] = {
    "Partition": pb.PartitionResponse,
    "OpsToNotDecompose": pb.OpsToNotDecomposeResponse,
    "TransformForPreDecomposition": pb.TransformForPreDecompositionResponse,
    "Quantize": pb.QuantizeResponse,
}
#: A wait longer than this is no wait at all (no deadline may show as a huge remaining time).
_MAX_WAIT = 7 * 24 * 3600.0
#: Bytes per message of a server stream (ReadBlobs, Lower).
READ_CHUNK_BYTES = 1 << 20
#: The status message carries at most this much of an exception's message (ErrorInfo has all).
_SUMMARY_CHARS = 512

_SPEC_TYPES = {
    bool: pb.SPEC_TYPE_BOOL,
    int: pb.SPEC_TYPE_INT,
    float: pb.SPEC_TYPE_DOUBLE,
    str: pb.SPEC_TYPE_STRING,
    bytes: pb.SPEC_TYPE_BYTES,
}


def spec_from_message(spec: Iterable[pb.SpecEntry]) -> dict[str, object]:
    """Spec entries -> plain Python values, in order (an unset value is None, which
    validation refuses).

    Raises:
        ServiceError: INVALID_SPEC, a key appears twice.
    """
    out: dict[str, object] = {}
    for entry in spec:
        if entry.key in out:
            raise ServiceError(
                Reason.INVALID_SPEC, f"spec key {entry.key!r} appears more than once"
            )
        kind = entry.value.WhichOneof("value")
        out[entry.key] = getattr(entry.value, kind) if kind else None
    return out


def partitioner_raised(
    r: pb.RemoteException, who: str = "the hosted partitioner"
) -> ServiceError:
    """PARTITIONER_RAISED for an exception the hosted code (``who``) raised. The full message
    and traceback travel once, in the ErrorInfo; the status message is a summary, so that the
    trailers stay within gRPC's metadata limits."""
    summary = r.message if len(r.message) <= _SUMMARY_CHARS else r.message[:_SUMMARY_CHARS] + "..."
    return ServiceError(
        Reason.PARTITIONER_RAISED,
        f"{who} raised {r.type}: {summary}",
        {EXCEPTION_TYPE: r.type, EXCEPTION_MESSAGE: r.message, EXCEPTION_TRACEBACK: r.traceback,
         **({EXCEPTION_WITHOUT_ARGUMENTS: "true"} if r.without_arguments else {})},
    )


def build_hosted(
    registry: NamedRegistry[Any], ref: pb.PartitionerRef | pb.QuantizerRef, unknown: Reason,
    name_field: str | None = None,
) -> Any:
    """Build what ``ref`` names in ``registry`` (a hosted partitioner or quantizer) from its
    spec; ``name_field`` is the request field an unknown name is reported against.

    Raises:
        ServiceError: ``unknown``; INVALID_SPEC (a duplicate, unknown or ill-typed key, with
            the key and the type expected); PARTITIONER_RAISED (the hosted code's own
            constructor or configuration refused the spec).
    """
    try:
        hosted = registry.get(ref.name)
    except registry.unknown as e:
        raise ServiceError(unknown, str(e), field=name_field) from e
    spec = spec_from_message(ref.spec)
    try:
        return hosted.create(spec)
    except InvalidSpecError as e:
        raise ServiceError(
            Reason.INVALID_SPEC, str(e), {SPEC_KEY: e.key, EXPECTED_TYPE: e.expected},
            field=f"{registry.kind}.spec[{e.key}]",
        ) from e
    except Exception as e:  # the hosted code refused the spec
        raise partitioner_raised(hooks.remote_exception(e), f"the hosted {registry.kind}") from e


def _list_spec_keys(out: Any, keys: Iterable[SpecKey]) -> None:
    """Add ``keys`` to the repeated ``SpecKeyInfo`` field ``out``."""
    for key in keys:
        k = out.add(name=key.name, type=_SPEC_TYPES[key.type], doc=key.doc)
        if key.default is not None:
            k.default.CopyFrom(spec_value(key.name, key.default))


def _backend_module(backend_id: str) -> str:
    """The module defining the ``BackendDetails`` subclass named ``backend_id``, or ""."""
    from executorch.exir.backend.backend_details import BackendDetails

    for cls in BackendDetails.__subclasses__():
        if cls.__name__ == backend_id:
            return cls.__module__
    return ""


def _compile_spec(cs: pb.CompileSpec) -> Any:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return CompileSpec(cs.key, bytes(cs.value))


def check_deadline(time_remaining: TimeRemaining) -> None:
    remaining = time_remaining()
    if remaining is not None and remaining <= 0:
        raise ServiceError(
            Reason.DEADLINE_PASSED, "the deadline passed before the work could start"
        )


def _response_digests(response: Message) -> Iterator[pb.Digest]:
    """The blobs a hook response names (a transformed program's, a replaced module's)."""
    if isinstance(response, pb.TransformForPreDecompositionResponse) and response.HasField(
        "program"
    ):
        yield from codec.iter_digests(response.program)
    if isinstance(response, pb.QuantizeResponse) and response.HasField("transform_module"):
        yield from codec.iter_digests(response.transform_module.program)


def _preprocess_digests(response: pb.PreprocessResponse) -> Iterator[pb.Digest]:
    """The blobs a Preprocess response names (processed bytes, named data buffers)."""
    for method in response.methods:
        for r in method.results:
            yield r.processed_bytes
            yield from r.data_store_output.buffers


def chunks(data: BlobView | bytes) -> Iterator[bytes]:
    """``data`` in :data:`READ_CHUNK_BYTES` pieces (one empty piece for empty data)."""
    view = memoryview(data)
    if not view.nbytes:
        yield b""
    for off in range(0, view.nbytes, READ_CHUNK_BYTES):
        yield bytes(view[off : off + READ_CHUNK_BYTES])


class PartitionerInstance:
    """Implements ``remote_partitioner.v1.RemotePartitioner`` over a registry and blob store.

    Thread-safe. Hook calls and lowerings are admitted (:meth:`admit`, by the caller) up to
    ``limits.max_concurrent_hooks`` at once (beyond: OVERLOADED with a retry delay) and then run
    one at a time in the process (:meth:`turn`):
    ExecuTorch partitioners and fake tensor modes share process-wide state (scale with worker
    processes). A call whose deadline passes while it waits for its turn does not run.
    """

    def __init__(
        self,
        registry: Registry,
        blobs: Blobs,
        limits: Limits | None = None,
        results: ResultCache | None = None,
        backends: BackendRegistry | None = None,
        quantizers: QuantizerRegistry | None = None,
    ) -> None:
        self.registry = registry
        #: The quantizers ``Quantize`` runs (default: the built-in ones and plugins).
        self.quantizers = quantizers if quantizers is not None else default_quantizers()
        #: The backends ``Preprocess`` runs (default: the built-in ones and plugins).
        self.backends = backends if backends is not None else default_backend_registry()
        self.blobs = blobs
        self.limits = limits or Limits()
        self.results = results if results is not None else ResultCache(0)
        #: Fresh ``Lower`` answers sent and not yet stored, by result cache key
        #: (:func:`~remote_partitioner.server.lower_call.remember_in_background`).
        self.lowerings_being_stored: dict[str, Lowered] = {}
        self.lowerings_lock = threading.Lock()
        self._admitted = threading.BoundedSemaphore(self.limits.max_concurrent_hooks)
        self._hook_lock = threading.Lock()
        #: Upload bytes in flight, bounded by ``limits.max_inflight_bytes``.
        self.inflight = ByteBudget(self.limits.max_inflight_bytes, self.limits.retry_after_seconds)

    # ------------------------------------------------------------------ discovery

    def list_partitioners(self) -> pb.ListPartitionersResponse:
        """The hosted partitioners, their spec keys and hooks, and this server's versions."""
        response = pb.ListPartitionersResponse(
            versions=server_versions(), accepts_withheld_tensors=True,
            accepts_withheld_lowered_programs=True,
        )
        for name in self.registry.names():
            hosted = self.registry.get(name)
            info = response.partitioners.add(
                name=hosted.name,
                backend_id=hosted.backend_id,
                class_name=f"{hosted.partitioner_class.__module__}."
                f"{hosted.partitioner_class.__qualname__}",
                description=hosted.description,
                overridden_hooks=[hook_to_wire(h) for h in hosted.overridden_hooks()],
                backend_module=_backend_module(hosted.backend_id),
            )
            _list_spec_keys(info.spec_keys, hosted.spec_keys.values())
        for backend in self.backends:
            response.backends.add(
                backend_id=backend.backend_id, description=backend.description,
                module=backend.module,
            )
        for name in self.quantizers.names():
            q = self.quantizers.get(name)
            qinfo = response.quantizers.add(
                name=q.name,
                class_name=f"{q.quantizer_class.__module__}.{q.quantizer_class.__qualname__}",
                backend_id=q.backend_id,
                description=q.description,
                loads_quantized_kernels=q.loads_quantized_kernels,
            )
            _list_spec_keys(qinfo.spec_keys, q.spec_keys.values())
        return response

    # ------------------------------------------------------------------ blobs

    def find_missing_blobs(
        self, request: pb.FindMissingBlobsRequest
    ) -> pb.FindMissingBlobsResponse:
        """The digests of ``request`` this server does not hold."""
        self.check_count(len(request.digests))
        missing = []
        for d in request.digests:
            self.check_digest(d)
            if not self.blobs.has(d.hash, d.size_bytes):
                missing.append(d)
        return pb.FindMissingBlobsResponse(missing_digests=missing)

    def upload(self) -> UploadAssembly:
        """A new assembly for one ``UploadBlobs`` stream."""
        return UploadAssembly(self.blobs, self.check_digest, self.inflight)

    def read_blobs(self, request: pb.ReadBlobsRequest) -> Iterator[pb.ReadBlobsResponse]:
        """The blobs ``request`` names, in chunks; each is looked up when its turn comes.

        Raises:
            ServiceError: LIMIT_EXCEEDED / INVALID_DIGEST (checked before the first chunk),
                BLOB_NOT_FOUND for a blob not held (when its turn comes).
        """
        self.check_count(len(request.digests))
        for d in request.digests:
            self.check_digest(d)
        return self._read(list(request.digests))

    def _read(self, digests: list[pb.Digest]) -> Iterator[pb.ReadBlobsResponse]:
        for d in digests:
            data = self.blobs.get(d.hash)
            if data is None or len(data) != d.size_bytes:
                raise ServiceError(
                    Reason.BLOB_NOT_FOUND, f"blob {d.hash}/{d.size_bytes} is not held",
                    {BLOB_DIGEST: d.hash},
                )
            for i, piece in enumerate(chunks(data)):
                yield pb.ReadBlobsResponse(digest=d, offset=i * READ_CHUNK_BYTES, data=piece)

    # ------------------------------------------------------------------ hooks

    def partition(
        self, request: pb.PartitionRequest, time_remaining: TimeRemaining
    ) -> pb.PartitionResponse:
        """``Partitioner.partition`` on the request's program: its tags and meta changes."""
        return self._hook("Partition", request, time_remaining, hooks.partition)

    def ops_to_not_decompose(
        self, request: pb.OpsToNotDecomposeRequest, time_remaining: TimeRemaining
    ) -> pb.OpsToNotDecomposeResponse:
        """``Partitioner.ops_to_not_decompose``, its filter evaluated on every node."""
        return self._hook(
            "OpsToNotDecompose", request, time_remaining, hooks.ops_to_not_decompose
        )

    def store_blobs(self, blobs: Mapping[str, Any]) -> None:
        """Keep blobs a response names (hash -> bytes-like), for the client to read back."""
        for h, data in blobs.items():
            raw = bytes(data)
            self.blobs.put(h, len(raw), raw, hashed=True)

    def transform_for_pre_decomposition(
        self, request: pb.TransformForPreDecompositionRequest, time_remaining: TimeRemaining
    ) -> pb.TransformForPreDecompositionResponse:
        """``Partitioner.transform_for_pre_decomposition``; a new program's blobs are stored
        here for the client to read back."""

        def transform(
            partitioner: Partitioner, ep: ExportedProgram
        ) -> pb.TransformForPreDecompositionResponse:
            out = hooks.transform_for_pre_decomposition(partitioner, ep)
            if out is None:
                return pb.TransformForPreDecompositionResponse(unchanged=True)
            if value_reads.is_watching():
                # The new program goes back with its tensors' data, which this one withholds.
                raise value_reads.TensorDataRequired(
                    "the transform returned another program, whose tensors are sent back "
                    "with their data"
                )
            encoded = codec.encode_program(out)
            self.store_blobs(encoded.blobs)
            return pb.TransformForPreDecompositionResponse(program=encoded.message)

        return self._hook("TransformForPreDecomposition", request, time_remaining, transform)

    def _hook(
        self,
        rpc: str,
        request: HookRequest,
        time_remaining: TimeRemaining,
        hook: Callable[[Partitioner, ExportedProgram], _M],
    ) -> _M:
        """A partitioner hook (see :meth:`run_on_program`)."""
        assert not isinstance(request, pb.QuantizeRequest)
        ref = request.partitioner
        return self.run_on_program(
            rpc, request, time_remaining, lambda: self.partitioner(ref), hook
        )

    def run_on_program(
        self,
        rpc: str,
        request: HookRequest,
        time_remaining: TimeRemaining,
        build: Callable[[], _T],
        hook: Callable[[_T, ExportedProgram], _M],
    ) -> _M:
        """Build the hosted object (``build()``: a partitioner, a quantizer), decode the
        program, run ``hook`` on both in turn.

        A request whose bytes were answered before, and whose blobs (and the answer's) are
        all still held, is answered from the result cache, without a turn.

        A program that withholds tensors (``TensorRef.withheld``) is rebuilt with fakes in
        their place and the hook watched (:mod:`.value_reads`): if it used a withheld tensor
        for more than its metadata, its answer (or exception) is dropped and the client is
        asked for the data (TENSOR_DATA_REQUIRED).
        """
        hosted = build()
        rng_state = caller_rng.parse(request.rng_state)
        program = self._program(request)
        self._check_program(program)
        key = self.results.key(rpc, request)
        if self._held(codec.iter_digests(program)):
            cached = self.results.get(
                key, _RESPONSES[rpc], lambda r: self._held(_response_digests(r))
            )
            if cached is not None:
                return cached  # type: ignore[return-value]
        withheld = codec.has_withheld(program)
        with self.turn(time_remaining):
            ep = self._decode(program, value_reads.Withheld() if withheld else None)
            check_deadline(time_remaining)
            watch = value_reads.watching() if withheld else contextlib.nullcontext()
            reads = None
            try:
                # The turn is the process's one hook slot: nothing else uses the generator
                # between setting the caller's state and reading it back.
                with caller_rng.running_with(rng_state) as after, watch as reads:
                    response = hook(hosted, ep)
            except value_reads.TensorDataRequired as e:
                raise self._data_required(rpc, str(e), None) from e
            except hooks.PartitionerRaised as e:
                if reads:
                    raise self._data_required(rpc, None, reads) from e
                raise partitioner_raised(e.remote) from e
            except (codec.UnrepresentableMeta, codec.ProgramEncodeError) as e:
                if reads:
                    raise self._data_required(rpc, None, reads) from e
                raise ServiceError(Reason.UNREPRESENTABLE_RESULT, str(e)) from e
            if reads:
                raise self._data_required(rpc, None, reads)
            if after:
                response.rng_state = after[0]  # type: ignore[attr-defined]
        self.results.put(key, response)
        return response

    @staticmethod
    def _data_required(
        rpc: str, why: str | None, reads: value_reads.ValueReads | None
    ) -> ServiceError:
        """TENSOR_DATA_REQUIRED for a hook on a program with withheld tensors."""
        info: dict[str, str] = {}
        if reads:
            info = {TENSOR_NAME: reads.tensor or "", TENSOR_USE: reads.operation or ""}
            why = f"the hosted partitioner used {reads.describe()}"
        return ServiceError(
            Reason.TENSOR_DATA_REQUIRED,
            f"{rpc}: {why}, so its answer may depend on what the client withheld: send the "
            "program again whole (its tensors' data, its lowered modules' programs)",
            info,
        )

    # ------------------------------------------------------------------ preprocess

    def preprocess(
        self, request: pb.PreprocessRequest, time_remaining: TimeRemaining
    ) -> pb.PreprocessResponse:
        """A hosted backend's ``preprocess`` (or ``preprocess_multimethod``) on the request's
        programs; the results' processed bytes and named data buffers are stored here for the
        client to read back.

        Raises:
            ServiceError: UNKNOWN_BACKEND; INVALID_PROGRAM (no program, several for
                ``preprocess``, a method named twice, undecodable); the limits, blob and
                fingerprint errors of the hooks; PARTITIONER_RAISED (the backend raised);
                UNREPRESENTABLE_RESULT.
        """
        try:
            hosted = self.backends.get(request.backend_id)
        except UnknownBackendError as e:
            raise ServiceError(Reason.UNKNOWN_BACKEND, str(e), field="backend_id") from e
        count = sum(len(m.programs) for m in request.methods)
        names = [m.name for m in request.methods]
        if count == 0:
            raise ServiceError(Reason.INVALID_PROGRAM, "no program to preprocess", field="methods")
        if not request.multimethod and count != 1:
            raise ServiceError(
                Reason.INVALID_PROGRAM,
                f"preprocess takes one program, the request has {count} (set multimethod)",
                field="methods",
            )
        if len(set(names)) != len(names):
            raise ServiceError(
                Reason.INVALID_PROGRAM, "a method is named more than once", field="methods"
            )
        self.check_count(count)
        rng_state = caller_rng.parse(request.rng_state)
        programs = [
            [self._program_blob(p.program_digest) for p in m.programs] for m in request.methods
        ]
        for method in programs:
            for program in method:
                self._check_program(program)
        key = self.results.key("Preprocess", request)
        if self._held(d for method in programs for p in method for d in codec.iter_digests(p)):
            cached = self.results.get(
                key, pb.PreprocessResponse, lambda r: self._held(_preprocess_digests(r))
            )
            if cached is not None:
                return cached
        with self.turn(time_remaining):
            inputs: list[preprocess_runner.MethodPrograms] = []
            for m, method in zip(request.methods, programs, strict=True):
                items = []
                for p, program in zip(m.programs, method, strict=True):
                    ep = self._decode(program)
                    try:
                        codec.apply_node_meta(ep, p.node_meta)
                    except codec.ProgramDecodeError as e:
                        raise ServiceError(Reason.INVALID_PROGRAM, str(e)) from e
                    specs = [_compile_spec(cs) for cs in p.compile_specs]
                    items.append((ep, specs))
                inputs.append((m.name, items))
            check_deadline(time_remaining)
            try:
                # The turn is the process's one slot: nothing else uses the generator between
                # setting the caller's state and reading it back.
                with caller_rng.running_with(rng_state) as after:
                    results = preprocess_runner.run(
                        hosted.backend_cls, inputs, request.multimethod, hosted.fresh_state
                    )
            except hooks.PartitionerRaised as e:
                raise partitioner_raised(
                    e.remote, f"the preprocess of backend {request.backend_id!r}"
                ) from e
            response = pb.PreprocessResponse()
            for name, method_results in results:
                entry = response.methods.add(name=name)
                for result in method_results:
                    try:
                        out, blobs = codec.encode_preprocess_result(result)
                    except (codec.UnrepresentableMeta, TypeError) as e:
                        raise ServiceError(Reason.UNREPRESENTABLE_RESULT, str(e)) from e
                    self.store_blobs(blobs)
                    entry.results.append(out)
            if after:
                response.rng_state = after[0]
        self.results.put(key, response)
        return response

    # ------------------------------------------------------------------ quantizers

    def quantize(
        self, request: pb.QuantizeRequest, time_remaining: TimeRemaining
    ) -> pb.QuantizeResponse:
        """A hosted quantizer's steps on the request's module
        (:func:`remote_partitioner.server.quantize_call.run`)."""
        from remote_partitioner.server import quantize_call

        return self.run_on_program(
            "Quantize", request, time_remaining,
            lambda: quantize_call.build_quantizer(self, request.quantizer),
            lambda quantizer, ep: quantize_call.run(quantizer, ep, request, self.store_blobs),
        )

    # ------------------------------------------------------------------ whole lowering

    def lower(self, request: pb.LowerRequest, time_remaining: TimeRemaining) -> Lowered:
        """Lower the request's PT2 archive with its partitioners, or answer a repeat from the
        result cache (:func:`remote_partitioner.server.lower_call.lower`)."""
        from remote_partitioner.server import lower_call

        return lower_call.lower(self, request, time_remaining)

    # ------------------------------------------------------------------ admission

    def admit(self) -> Callable[[], None]:
        """Admit one hook call or lowering, or refuse it at once; return the function that
        ends the admission (call it exactly once, when the work is over).

        Raises:
            ServiceError: OVERLOADED (with a retry delay), ``max_concurrent_hooks`` calls are
                already admitted.
        """
        if not self._admitted.acquire(blocking=False):
            delay = self.limits.retry_after_seconds
            raise ServiceError(
                Reason.OVERLOADED,
                f"{self.limits.max_concurrent_hooks} hook calls are already in progress; "
                f"retry in {delay:g} s",
                retry_after=delay,
            )
        return self._admitted.release

    @contextlib.contextmanager
    def turn(self, time_remaining: TimeRemaining) -> Iterator[None]:
        """Hold the process's one hook slot; wait for it until the caller's deadline.

        Raises:
            ServiceError: DEADLINE_PASSED, the deadline passed while the call waited.
        """
        remaining = time_remaining()
        wait = -1.0 if remaining is None or remaining > _MAX_WAIT else max(remaining, 0.0)
        if not self._hook_lock.acquire(timeout=wait):
            raise ServiceError(
                Reason.DEADLINE_PASSED, "the deadline passed while the call waited for its turn"
            )
        try:
            # What backend code prints (Vela's network summary) goes to the log, at DEBUG.
            with stdout_logged(_BACKEND_OUTPUT):
                yield
        finally:
            self._hook_lock.release()

    # ------------------------------------------------------------------ checks

    def check_digest(self, d: pb.Digest, field: str = "digests") -> None:
        """Refuse a malformed digest (INVALID_DIGEST) or one over the blob size limit."""
        try:
            check_digest(d.hash, d.size_bytes)
        except BlobError as e:
            raise ServiceError(Reason.INVALID_DIGEST, str(e), field=field) from e
        if d.size_bytes > self.limits.max_blob_bytes:
            raise self._limit(
                field, f"blob {d.hash} declares {d.size_bytes} bytes", self.limits.max_blob_bytes
            )

    def check_count(self, n: int) -> None:
        """Refuse a request naming more than ``max_digests`` digests."""
        if n > self.limits.max_digests:
            raise self._limit("digests", f"{n} digests", self.limits.max_digests)

    @staticmethod
    def _limit(field: str, what: str, bound: int) -> ServiceError:
        return ServiceError(
            Reason.LIMIT_EXCEEDED, f"{what}, over this server's limit of {bound}", field=field
        )

    def _check_program(self, program: pb.Program) -> None:
        """Bound a program by what it declares, before any of it is decoded."""
        limits = self.limits
        if program.graph.size_bytes > limits.max_graph_bytes:
            raise self._limit(
                "program.graph.size_bytes",
                f"the graph declares {program.graph.size_bytes} bytes", limits.max_graph_bytes,
            )
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
            stack.extend(codec.nested_programs(p))
        if nodes > limits.max_nodes:
            raise self._limit(
                "program.fingerprint", f"the program has {nodes} nodes", limits.max_nodes
            )
        if total > limits.max_program_bytes:
            raise self._limit(
                "program", f"the program names {total} bytes of blobs", limits.max_program_bytes
            )

    # ------------------------------------------------------------------ inputs

    def partitioner(self, ref: pb.PartitionerRef) -> Partitioner:
        """Build the hosted partitioner ``ref`` names.

        Raises:
            ServiceError: UNKNOWN_PARTITIONER; INVALID_SPEC (a duplicate key, an unknown key
                or a value of the wrong type); PARTITIONER_RAISED (its constructor refused).
        """
        return build_hosted(self.registry, ref, Reason.UNKNOWN_PARTITIONER)

    def _program(self, request: HookRequest) -> pb.Program:
        """The request's program: inline, or read from the ``program_digest`` blob."""
        if not request.HasField("program_digest"):
            return request.program
        if request.HasField("program"):
            raise ServiceError(
                Reason.INVALID_PROGRAM, "set program or program_digest, not both",
                field="program_digest",
            )
        return self._program_blob(request.program_digest)

    def _program_blob(self, d: pb.Digest) -> pb.Program:
        """The ``Program`` message held in blob ``d``.

        Raises:
            ServiceError: INVALID_DIGEST, LIMIT_EXCEEDED, BLOB_MISSING, INVALID_PROGRAM.
        """
        self.check_digest(d, "program_digest")
        if d.size_bytes > self.limits.max_graph_bytes:
            raise self._limit(
                "program_digest", f"the program message declares {d.size_bytes} bytes",
                self.limits.max_graph_bytes,
            )
        data = self.required_blob(d, "program")
        program = pb.Program()
        try:
            program.ParseFromString(bytes(data))
        except DecodeError as e:
            raise ServiceError(
                Reason.INVALID_PROGRAM, f"blob {d.hash} is not a Program message: {e}"
            ) from e
        return program

    def required_blob(self, d: pb.Digest, what: str) -> BlobView:
        """The blob a request names directly, or BLOB_MISSING."""
        data = self.blobs.get(d.hash)
        if data is None or len(data) != d.size_bytes:
            raise ServiceError(
                Reason.BLOB_MISSING,
                f"{what} blob {d.hash}/{d.size_bytes} is missing; upload it and call again",
                {BLOB_DIGEST: d.hash},
            )
        return data

    def _blob(self, d: pb.Digest) -> BlobView:
        data = self.blobs.get(d.hash)
        if data is None:
            raise codec.BlobMissing(d)
        return data

    def _held(self, digests: Iterable[pb.Digest]) -> bool:
        return all(self.blobs.has(d.hash, d.size_bytes) for d in digests)

    def _decode(
        self, program: pb.Program, withheld: codec.WithheldTensors | None = None
    ) -> ExportedProgram:
        try:
            return codec.decode_program(program, self._blob, withheld=withheld)
        except codec.BlobMissing as e:
            raise ServiceError(
                Reason.BLOB_MISSING, f"{e}; upload it and call again",
                {BLOB_DIGEST: e.digest.hash},
            ) from e
        except codec.FingerprintMismatch as e:
            raise ServiceError(Reason.FINGERPRINT_MISMATCH, str(e)) from e
        except codec.BlobSizeMismatch as e:
            raise ServiceError(Reason.SIZE_MISMATCH, str(e)) from e
        except codec.ProgramDecodeError as e:
            raise ServiceError(
                Reason.INVALID_PROGRAM, f"the program cannot be decoded: {e}"
            ) from e
        except Exception as e:
            logger.exception("decoding a program failed")
            raise ServiceError(
                Reason.INVALID_PROGRAM,
                f"the program cannot be decoded: {type(e).__name__}: {e}",
            ) from e


__all__ = [
    "READ_CHUNK_BYTES",
    "PartitionerInstance",
    "spec_from_message",
]
