"""Observability: Prometheus metrics, request ids and one access-log line per call.

Three pieces, none of which changes what a call answers:

- :class:`Metrics` owns a private ``prometheus_client.CollectorRegistry`` (never the global one,
  so several servers can live in one process) holding the service's metrics, and can expose it
  over HTTP (:meth:`Metrics.serve`).
- :class:`ObservabilityInterceptor`, a ``grpc.aio.ServerInterceptor``, wraps every handler (all four
  kinds) to count calls, time them, sum message sizes, track calls in flight and the blob
  cache's hits and misses, give each call a request id and log one access line per call.
- :func:`configure_logging` sets up process logging with the request id in every line, at one
  level for everything the process writes through logging (libraries, Python warnings, progress
  bars given a :class:`ProgressLog`), known-harmless library messages demoted to DEBUG.

Request ids. A call's id is the incoming ``x-request-id`` metadata value when it is 1 to 64
characters of ``[A-Za-z0-9._-]``, else a fresh ``uuid4().hex`` (32 lowercase hex characters).
The id is sent back as *initial* metadata ``x-request-id`` for every handler kind, before the
handler runs: initial metadata reaches the client on success and on error alike (also in
``grpc.RpcError.initial_metadata()``), whereas trailing metadata is replaced by
``context.abort_with_status``, which the servicer uses for every error. Handlers must therefore
not call ``context.send_initial_metadata`` themselves (gRPC allows it once per call); a second
ObservabilityInterceptor nested in the first reuses the outer id and sends nothing. While the
handler runs, the id is in the context variable :data:`REQUEST_ID`, and :class:`RequestIdFilter`
copies it to ``record.request_id`` of every log record ("-" outside calls).

Status codes. A call's code is the one gRPC will send: the code the handler aborts with
(``context.abort`` / ``abort_with_status``), or ``context.code()`` when it set one; else OK when
the handler returned, UNKNOWN when it raised; a call the client cancelled, or whose deadline
passed, while the handler ran is CANCELLED or DEADLINE_EXCEEDED.

When. A call is recorded (metrics and access line) before the client can see its status: when
the handler returns or raises, or, when it aborts, just before ``abort`` sends the status (which
grpc.aio does before the handler unwinds). A scrape or log read after the client's answer holds
the call; a server killed just after answering has logged it. (A deadline that passes, or a
cancellation, reaches the client first: such a call is recorded when its handler ends.)

Labels. ``rpc`` is the method name for ``remote_partitioner.v1.RemotePartitioner`` (e.g.
``Partition``) and ``service/method`` for any other service on the server (e.g.
``grpc.health.v1.Health/Check``); only methods the server implements reach the interceptor
with a handler, so the set is bounded. ``partitioner`` is ``request.partitioner.name`` for the
hook RPCs (Partition, OpsToNotDecompose, TransformForPreDecomposition) and "" for the others; a
name that is not 1 to 64 characters of ``[a-z0-9_.-]`` (or, when the interceptor is given
``known_partitioners``, not one of them) becomes ``other``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import io
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
)
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TextIO

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from remote_partitioner.proto.transport import SERVICE_NAME as _SERVICE
from remote_partitioner.server.blobstore import Blobs
from remote_partitioner.server.handlers import rewrap
from remote_partitioner.server.results import ResultCache

#: The metadata key carrying a call's request id, both ways.
REQUEST_ID_KEY = "x-request-id"
#: The logger the access lines go to.
ACCESS_LOGGER = "remote_partitioner.server.access"
#: The log format :func:`configure_logging` installs.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
#: Latency buckets in seconds: 1 ms to 10 min.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
#: The ``partitioner`` label of names outside the allowed set.
OTHER = "other"

#: The current call's request id; None outside a call.
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "remote_partitioner_request_id", default=None
)

_HOOK_RPCS = frozenset({"Partition", "OpsToNotDecompose", "TransformForPreDecomposition"})
_FIND_MISSING_BLOBS = "FindMissingBlobs"
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_VALID_PARTITIONER = re.compile(r"[a-z0-9_.-]{1,64}")
_OWNED_HANDLER = "_remote_partitioner_observability"
_WARNINGS_LOGGER = "py.warnings"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ---------------------------------------------------------------------------------- metrics


class StreamGauges(Protocol):
    """What :meth:`Metrics.bind_server` reads: the servicer's stream counts."""

    @property
    def open_streams(self) -> int: ...

    @property
    def inflight_bytes(self) -> int: ...


class Metrics:
    """The service's Prometheus metrics, in a registry of their own.

    Metrics (``rpc``, ``partitioner``, ``code`` and ``result`` are labels):

    - ``remote_partitioner_requests_total{rpc, partitioner, code}``: calls finished.
    - ``remote_partitioner_request_seconds{rpc, partitioner}``: call latency (histogram,
      :data:`LATENCY_BUCKETS`).
    - ``remote_partitioner_received_bytes_total{rpc}`` /
      ``remote_partitioner_sent_bytes_total{rpc}``: serialized message bytes, summed over the
      messages of a stream.
    - ``remote_partitioner_in_flight{rpc}``: calls running.
    - ``remote_partitioner_blob_cache_total{result}``: ``FindMissingBlobs`` digests the store
      held (``hit``) or lacked (``miss``).
    - ``remote_partitioner_blob_store_bytes`` / ``remote_partitioner_blob_store_blobs``: the
      bound blob store's size, read at scrape time (0 while none is bound).
    - ``remote_partitioner_open_streams``: streaming calls open now (uploads, blob reads,
      lowerings sending their ``.pte``), and ``remote_partitioner_inflight_upload_bytes``: the
      declared bytes of the blobs being uploaded now; both read at scrape time from the
      server bound with :meth:`bind_server` (0 while none is bound).

    Thread-safe. ``registry`` is the ``CollectorRegistry``; scrape it with
    ``prometheus_client.generate_latest(metrics.registry)`` or over HTTP with :meth:`serve`.
    """

    def __init__(self, blob_store: Blobs | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "remote_partitioner_requests", "RPCs finished, by method, partitioner and code.",
            ["rpc", "partitioner", "code"], registry=self.registry,
        )
        self.latency = Histogram(
            "remote_partitioner_request_seconds", "RPC latency in seconds.",
            ["rpc", "partitioner"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.received_bytes = Counter(
            "remote_partitioner_received_bytes", "Serialized request message bytes received.",
            ["rpc"], registry=self.registry,
        )
        self.sent_bytes = Counter(
            "remote_partitioner_sent_bytes", "Serialized response message bytes sent.",
            ["rpc"], registry=self.registry,
        )
        self.in_flight = Gauge(
            "remote_partitioner_in_flight", "RPCs running.", ["rpc"], registry=self.registry,
        )
        self.blob_cache = Counter(
            "remote_partitioner_blob_cache", "FindMissingBlobs digests held (hit) or not (miss).",
            ["result"], registry=self.registry,
        )
        for result in ("hit", "miss"):
            self.blob_cache.labels(result=result)
        self.result_cache = Gauge(
            "remote_partitioner_result_cache_lookups",
            "Result cache lookups since start: answered from memory (hit), from the shared "
            "directory (disk_hit), or not (miss).",
            ["result"], registry=self.registry,
        )
        self.blob_store_bytes = Gauge(
            "remote_partitioner_blob_store_bytes", "Bytes held by the blob store.",
            registry=self.registry,
        )
        self.blob_store_blobs = Gauge(
            "remote_partitioner_blob_store_blobs", "Blobs held by the blob store.",
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "remote_partitioner_open_streams", "Streaming calls open now.",
            registry=self.registry,
        )
        self.inflight_upload_bytes = Gauge(
            "remote_partitioner_inflight_upload_bytes",
            "Declared bytes of the blobs being uploaded now.", registry=self.registry,
        )
        self._http: Any = None
        self._http_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if blob_store is not None:
            self.bind_blob_store(blob_store)

    def bind_blob_store(self, store: Blobs) -> None:
        """Report ``store``'s bytes and blob count (replacing any store bound before)."""
        self.blob_store_bytes.set_function(lambda: float(store.nbytes))
        self.blob_store_blobs.set_function(lambda: float(len(store)))

    def bind_result_cache(self, cache: ResultCache) -> None:
        """Report ``cache``'s lookups (replacing any cache bound before)."""
        self.result_cache.labels(result="hit").set_function(
            lambda: float(cache.hits - cache.disk_hits)
        )
        self.result_cache.labels(result="disk_hit").set_function(lambda: float(cache.disk_hits))
        self.result_cache.labels(result="miss").set_function(lambda: float(cache.misses))

    def bind_server(self, stats: StreamGauges) -> None:
        """Report ``stats``' open streams and upload bytes in flight (replacing any bound
        before)."""
        self.open_streams.set_function(lambda: float(stats.open_streams))
        self.inflight_upload_bytes.set_function(lambda: float(stats.inflight_bytes))

    def observe_call(
        self, rpc: str, partitioner: str, code: grpc.StatusCode, seconds: float,
        received: int, sent: int,
    ) -> None:
        """Record one finished call."""
        self.requests.labels(rpc=rpc, partitioner=partitioner, code=code.name).inc()
        self.latency.labels(rpc=rpc, partitioner=partitioner).observe(seconds)
        self.received_bytes.labels(rpc=rpc).inc(received)
        self.sent_bytes.labels(rpc=rpc).inc(sent)

    def observe_cache(self, hits: int, misses: int) -> None:
        """Record one ``FindMissingBlobs`` answer: ``hits`` digests held, ``misses`` not."""
        self.blob_cache.labels(result="hit").inc(hits)
        self.blob_cache.labels(result="miss").inc(misses)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve the registry as Prometheus text at ``http://addr:port/metrics`` (any path
        answers) from a daemon thread; port 0 picks a free port. Returns the bound port.

        Raises:
            RuntimeError: already serving.
            OSError: the address cannot be bound.
        """
        with self._lock:
            if self._http is not None:
                raise RuntimeError("metrics are already being served")
            # prometheus-client >= 0.20 returns the server and its thread.
            httpd, thread = start_http_server(port, addr=addr, registry=self.registry)
            self._http, self._http_thread = httpd, thread
            return int(httpd.server_port)

    def stop(self) -> None:
        """Stop serving (no-op when not serving); returns once the socket is closed."""
        with self._lock:
            httpd, thread = self._http, self._http_thread
            self._http, self._http_thread = None, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)


# ---------------------------------------------------------------------------------- logging


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` to the current call's id ("-" outside calls), unless the
    record already has one (e.g. from ``extra=``). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get() or "-"
        return True


def _level(level: str) -> int:
    value = logging.getLevelName(level.strip().upper())
    if isinstance(value, int):
        return value
    if level.strip().isdigit():
        return int(level.strip())
    raise ValueError(f"unknown log level {level!r}")


#: Messages that torch and the backends' libraries log at WARNING although they are known to
#: be harmless, by logger name: (the level :func:`configure_logging` gives them instead, a
#: regular expression searched in the message). At start-up (DEBUG): torchao's CUDA kernels and
#: Triton, absent on a CPU host; coremltools' native runtime, which exists on macOS only, and
#: its version notes; torchao registering an Enum as a pytree constant. On every lowering: torch's
#: export deep-copies its own ``LeafSpec`` s, which warns about the class itself (a
#: ``FutureWarning`` raised inside torch, DEBUG); Core ML's preprocess says of every model
#: that it "will not run on all version of iOS/macOS" (INFO).
KNOWN_NOISE: dict[str, tuple[tuple[int, str], ...]] = {
    "torchao": ((logging.DEBUG, r"^Failed to load \S*/torchao/_C\w*\.\S+\.so: "),),
    "torchao.kernel.intmm": ((logging.DEBUG, r"^Warning: Detected no triton, "),),
    "coremltools": (
        (logging.DEBUG,
         r"^Failed to load _ML\w+Proxy: No module named 'coremltools\.libcoremlpython'$"),
        (logging.DEBUG, r"^scikit-learn version \S+ is not supported\."),
        (logging.DEBUG, r"^Torch version \S+ has not been tested with coremltools\."),
    ),
    "torch.utils._pytree": (
        (logging.DEBUG, r"^<enum 'KernelPreference'> is an Enum subclass and is now natively "
                        r"supported by torch\.compile"),
    ),
    "executorch.backends.apple.coreml.compiler.coreml_preprocess": (
        (logging.INFO, r"^The model with identifier executorch_\S+ was exported with CoreML "
                       r"specification version \d+, and it will not run on all version of "),
    ),
    _WARNINGS_LOGGER: (
        (logging.DEBUG,
         r"/copyreg\.py:\d+: FutureWarning: `isinstance\(treespec, LeafSpec\)` is deprecated"),
    ),
}
#: How many distinct warnings :func:`configure_logging` remembers, to log each once at WARNING.
WARNINGS_REMEMBERED = 4096


class _Quieter(logging.Filter):
    """A logger's filter: a record whose message matches one of ``rules`` (level, pattern)
    gets that level when it had a higher one; with ``once``, a repeat of a message already
    logged becomes a DEBUG record (the first keeps its level). Then records below
    ``threshold`` are dropped (also for handlers other than the root's, e.g. torch's own)."""

    def __init__(
        self, threshold: int, rules: Iterable[tuple[int, str]] = (), *, once: bool = False
    ) -> None:
        super().__init__()
        self.threshold = threshold
        self.rules = tuple((level, re.compile(pattern)) for level, pattern in rules)
        self.once = once
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and (self.rules or self.once):
            message = record.getMessage()
            level = next((lv for lv, p in self.rules if p.search(message)), record.levelno)
            if self._repeated(message):
                level = logging.DEBUG
            if level < record.levelno:
                record.levelno, record.levelname = level, logging.getLevelName(level)
        return record.levelno >= self.threshold

    def _repeated(self, message: str) -> bool:
        if not self.once:
            return False
        if message in self._seen:
            return True
        if len(self._seen) < WARNINGS_REMEMBERED:
            self._seen.add(message)
        return False


class ProgressLog(io.TextIOBase):
    """A text stream to give a progress bar (tqdm's ``file=``) so that it logs instead of
    drawing: each line the bar ends (its final state; tqdm redraws with carriage returns, which
    are dropped) becomes one record of ``logger`` at ``level``. Give each bar a stream of its
    own (bars drawn by concurrent calls would interleave in a shared one)."""

    def __init__(self, logger: logging.Logger, level: int = logging.INFO) -> None:
        super().__init__()
        self._logger = logger
        self._level = level
        self._state = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *ended, self._state = (self._state + text).split("\n")
        for line in ended:
            state = _ANSI.sub("", line.rsplit("\r", 1)[-1]).strip()
            if state:
                self._logger.log(self._level, "%s", state)
        self._state = self._state.rsplit("\r", 1)[-1]  # only the latest redraw is kept
        return len(text)


class _StdoutRouter(io.TextIOBase):
    """``sys.stdout`` once :func:`stdout_logged` has run: a thread inside a
    ``stdout_logged`` block writes to its own :class:`ProgressLog`, every other thread to the
    stream that was ``sys.stdout`` before."""

    def __init__(self, underlying: TextIO) -> None:
        super().__init__()
        self.underlying = underlying
        self.local = threading.local()

    def writable(self) -> bool:
        return True

    def _target(self) -> TextIO:
        return getattr(self.local, "log", None) or self.underlying

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def fileno(self) -> int:
        return self.underlying.fileno()


_router_lock = threading.Lock()


@contextlib.contextmanager
def stdout_logged(logger: logging.Logger, level: int = logging.DEBUG) -> Iterator[None]:
    """Within the block, what this thread prints to ``sys.stdout`` becomes records of
    ``logger`` at ``level``, a line each (carriage-return redraws reduced to their last state,
    as :class:`ProgressLog` does); other threads print as before. The server runs each call's
    backend code so (Vela prints its network summary): its stdout holds only its own lines.

    Output written to file descriptor 1 by native code, bypassing ``sys.stdout``, is not
    caught. Blocks nest (the inner one's logger wins until it ends).
    """
    with _router_lock:
        router = sys.stdout
        if not isinstance(router, _StdoutRouter):
            router = _StdoutRouter(sys.stdout)
            sys.stdout = router
    outer = getattr(router.local, "log", None)
    log = ProgressLog(logger, level)
    router.local.log = log
    try:
        yield
    finally:
        log.write("\n")  # a last line without its newline is logged too
        router.local.log = outer


def configure_logging(level: str = "WARNING", *, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) at ``level`` with :data:`LOG_FORMAT` (which shows the request
    id), like ``logging.basicConfig``; call it before importing torch and the backends, so that
    what they log on import goes through it too.

    Installs one handler on the root logger, carrying a :class:`RequestIdFilter`, replacing the
    one a previous call installed (other handlers are left alone), and sets the root level. The
    handler itself has ``level``, so a library that lowers a logger's level (ExecuTorch's Vulkan
    partitioner sets the root logger to INFO when imported) does not make the output louder.
    The access logger (:data:`ACCESS_LOGGER`) is set to ``max(level, INFO)``: its INFO lines
    show only when ``level`` is INFO or lower.

    Python warnings are logged (``logging.captureWarnings``, logger ``py.warnings``): each
    distinct warning once at WARNING, its repeats at DEBUG. The messages of
    :data:`KNOWN_NOISE` are logged at the lower level it gives them. Filters a previous call
    installed are replaced.

    Raises:
        ValueError: ``level`` is not a logging level name or number.
    """
    numeric = _level(level)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _OWNED_HANDLER, False):
            root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RequestIdFilter())
    handler.setLevel(numeric)
    setattr(handler, _OWNED_HANDLER, True)
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.getLogger(ACCESS_LOGGER).setLevel(max(numeric, logging.INFO))
    for name in {*KNOWN_NOISE, _WARNINGS_LOGGER}:
        logger = logging.getLogger(name)
        for old_filter in list(logger.filters):
            if isinstance(old_filter, _Quieter):
                logger.removeFilter(old_filter)
        logger.addFilter(
            _Quieter(numeric, KNOWN_NOISE.get(name, ()), once=name == _WARNINGS_LOGGER)
        )
    logging.captureWarnings(True)


# ---------------------------------------------------------------------------------- interceptor


def request_id_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The first valid incoming ``x-request-id`` value, else a fresh ``uuid4().hex``."""
    for key, value in metadata or ():
        if key.lower() == REQUEST_ID_KEY and isinstance(value, str):
            if _VALID_REQUEST_ID.fullmatch(value):
                return value
            break
    return uuid.uuid4().hex


def _rpc_label(method: str) -> tuple[str, bool]:
    """``/pkg.Service/Method`` -> (label, whether it is one of our hook RPCs)."""
    service, _, name = method.lstrip("/").rpartition("/")
    if service == _SERVICE:
        return name, name in _HOOK_RPCS
    return f"{service}/{name}" if service else name, False


def _size(message: Any) -> int:
    """Serialized size of a message (raw bytes when a handler has no deserializer)."""
    byte_size = getattr(message, "ByteSize", None)
    if byte_size is not None:
        return int(byte_size())
    if isinstance(message, (bytes, bytearray, memoryview)):
        return len(message)
    return 0


@dataclass
class _Call:
    """One call's bookkeeping."""

    rpc: str
    hook: bool
    request_id: str = ""
    partitioner: str = ""
    received: int = 0
    sent: int = 0
    start: float = field(default_factory=time.perf_counter)
    announce: bool = True
    #: Recorded (metrics and access line): once per call.
    finished: bool = False


def _final_code(
    context: grpc.aio.ServicerContext, error: BaseException | None
) -> grpc.StatusCode:
    """The status gRPC sends for a call whose handler ended with ``error`` (None: returned)."""
    code = context.code()
    if isinstance(code, int) and not isinstance(code, grpc.StatusCode):
        code = _CODES.get(code)
    if isinstance(code, grpc.StatusCode) and not (
        error is not None and code is grpc.StatusCode.OK
    ):
        return code
    if context.cancelled() or isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN


#: grpc.aio reports a code set by abort as the core's integer; by value.
_CODES: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


class _CountingContext:
    """A call's context that counts the bytes of the messages the handler writes, and records
    the call when the handler aborts it.

    grpc.aio sends an aborted call's status inside ``abort``, before the handler unwinds; the
    call is recorded (``on_abort(code)``: metrics and access line) just before, so that, as for
    a call that returns or raises, the record precedes the status the client sees (a replica
    killed right after answering has logged the answer)."""

    def __init__(
        self, context: grpc.aio.ServicerContext, call: _Call,
        on_abort: Callable[[grpc.StatusCode], None],
    ) -> None:
        self._context = context
        self._call = call
        self._on_abort = on_abort

    async def write(self, message: Any) -> None:
        self._call.sent += _size(message)
        await self._context.write(message)

    async def abort(
        self, code: grpc.StatusCode, details: str = "",
        trailing_metadata: tuple[tuple[str, str | bytes], ...] = (),
    ) -> NoReturn:
        if isinstance(code, grpc.StatusCode):  # (else grpc refuses it: recorded on unwinding)
            self._on_abort(code)
        await self._context.abort(code, details, trailing_metadata)  # type: ignore[attr-defined]
        raise AssertionError("abort returned")  # pragma: no cover

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class ObservabilityInterceptor(grpc.aio.ServerInterceptor):
    """Metrics, request ids and access logging for every call (see the module docstring).

    Args:
        metrics: where to record; None records nothing (ids and access lines only).
        logger: the access logger (default ``logging.getLogger(ACCESS_LOGGER)``); one INFO line
            per call: ``rpc=<rpc> partitioner=<name or -> code=<CODE> ms=<ms> in=<bytes>
            out=<bytes> request_id=<id>``.
        known_partitioners: when given, the ``partitioner`` label of any other name is
            ``other`` (bounds label cardinality against clients sending arbitrary names).

    Put it first in the server's interceptor list so that it also sees calls that later
    interceptors (e.g. authentication) reject. It never changes a call's outcome. Handlers are
    ``grpc.aio`` handlers: coroutine functions, or async generator functions for responses
    that stream by ``yield``.
    """

    def __init__(
        self,
        metrics: Metrics | None,
        logger: logging.Logger | None = None,
        *,
        known_partitioners: Collection[str] | None = None,
    ) -> None:
        self.metrics = metrics
        self.logger = logger if logger is not None else logging.getLogger(ACCESS_LOGGER)
        self.known_partitioners = (
            frozenset(known_partitioners) if known_partitioners is not None else None
        )

    # -- plumbing

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        rpc, hook = _rpc_label(handler_call_details.method)  # type: ignore[attr-defined]
        return rewrap(handler, lambda behavior, streaming_in: self._wrap(
            rpc, hook, behavior, streaming_in
        ))

    def partitioner_label(self, name: str) -> str:
        """The ``partitioner`` label for a requested partitioner name."""
        if not _VALID_PARTITIONER.fullmatch(name):
            return OTHER
        if self.known_partitioners is not None and name not in self.known_partitioners:
            return OTHER
        return name

    def _begin(self, call: _Call, context: grpc.aio.ServicerContext) -> None:
        """Count the call in flight and settle its request id (raises nothing). Inside another
        ObservabilityInterceptor (one already bound REQUEST_ID), reuse its id and send none."""
        if self.metrics is not None:
            self.metrics.in_flight.labels(rpc=call.rpc).inc()
        outer = REQUEST_ID.get()
        call.announce = outer is None
        call.request_id = outer or request_id_from_metadata(context.invocation_metadata())

    async def _announce(self, call: _Call, context: grpc.aio.ServicerContext) -> None:
        """Send the request id as initial metadata."""
        if call.announce:
            await context.send_initial_metadata(((REQUEST_ID_KEY, call.request_id),))

    def _note_request(self, call: _Call, request: Any) -> None:
        call.received += _size(request)
        if call.hook:
            ref = getattr(request, "partitioner", None)
            call.partitioner = self.partitioner_label(str(getattr(ref, "name", "")))

    def _note_response(self, call: _Call, request: Any, response: Any) -> None:
        call.sent += _size(response)
        if call.rpc == _FIND_MISSING_BLOBS and self.metrics is not None:
            digests = getattr(request, "digests", None)
            missing = getattr(response, "missing_digests", None)
            if digests is not None and missing is not None:
                self.metrics.observe_cache(len(digests) - len(missing), len(missing))

    def _finish(
        self, call: _Call, context: grpc.aio.ServicerContext, error: BaseException | None,
        code: grpc.StatusCode | None = None,
    ) -> None:
        """Record the call (once): ``code`` when the handler aborts with it, else the code its
        end gives (:func:`_final_code`)."""
        if call.finished:
            return
        call.finished = True
        seconds = time.perf_counter() - call.start
        if code is None:
            code = _final_code(context, error)
        if self.metrics is not None:
            self.metrics.in_flight.labels(rpc=call.rpc).dec()
            self.metrics.observe_call(
                call.rpc, call.partitioner, code, seconds, call.received, call.sent
            )
        self.logger.info(
            "rpc=%s partitioner=%s code=%s ms=%.1f in=%d out=%d request_id=%s",
            call.rpc, call.partitioner or "-", code.name, seconds * 1000.0, call.received,
            call.sent, call.request_id, extra={"request_id": call.request_id},
        )

    # -- every handler kind

    def _wrap(
        self, rpc: str, hook: bool, behavior: Callable[..., Any], streaming_in: bool
    ) -> Callable[..., Any]:
        """``behavior`` wrapped, of the same kind: an async generator function stays one (its
        responses are counted as they pass), a coroutine function stays one (the messages it
        writes with ``context.write`` are counted). A streamed request is counted message by
        message. Each call runs in a task of its own, so the request id bound here is seen by
        the handler and by nothing else."""

        if inspect.isasyncgenfunction(behavior):

            async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with self._observed(rpc, hook, request, context, streaming_in) as (
                    call, request, counting
                ):
                    async for response in behavior(request, counting):
                        call.sent += _size(response)
                        yield response

            return streamed

        async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with self._observed(rpc, hook, request, context, streaming_in) as (
                call, request, counting
            ):
                response = behavior(request, counting)
                if inspect.isawaitable(response):
                    response = await response
                if response is not None:
                    self._note_response(call, request, response)
                return response

        return awaited

    @contextlib.asynccontextmanager
    async def _observed(
        self, rpc: str, hook: bool, request: Any, context: grpc.aio.ServicerContext,
        streaming_in: bool,
    ) -> AsyncIterator[tuple[_Call, Any, _CountingContext]]:
        """One call's bookkeeping around its handler: count it in flight, bind and announce
        its request id, then record how it ended (also when it raised or was cancelled).
        Yields the call's record, the request (a counting iterator when it streams) and the
        context to hand the handler."""
        call = _Call(rpc, hook)
        self._begin(call, context)
        if streaming_in:
            request = self._counted(call, request)
        else:
            self._note_request(call, request)
        token = REQUEST_ID.set(call.request_id)
        error: BaseException | None = None
        try:
            await self._announce(call, context)
            yield call, request, _CountingContext(
                context, call, lambda code: self._finish(call, context, None, code)
            )
        except BaseException as e:
            error = e
            raise
        finally:
            REQUEST_ID.reset(token)
            self._finish(call, context, error)

    async def _counted(self, call: _Call, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            self._note_request(call, request)
            yield request


__all__ = [
    "ACCESS_LOGGER",
    "KNOWN_NOISE",
    "LATENCY_BUCKETS",
    "LOG_FORMAT",
    "REQUEST_ID",
    "REQUEST_ID_KEY",
    "Metrics",
    "ObservabilityInterceptor",
    "ProgressLog",
    "RequestIdFilter",
    "configure_logging",
    "request_id_from_metadata",
]
