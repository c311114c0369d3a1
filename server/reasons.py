"""Why a node stayed on the CPU: the partitioner's own words, captured while one hook runs.

ExecuTorch partitioners say why they leave a node out in three ways, none of which returns
anything to the caller:

* ``WhyNoPartition(logger)(node, reason)`` (``executorch.exir.backend.utils``) logs at DEBUG;
  XNNPACK's configs call it in about 55 places;
* ``WhyNoPartitionReporter.report_reject(node, reason)`` collects rejects for a table;
* backends log their own skip messages at INFO: Vulkan's ``VulkanSupportedOperators.log_skip``
  and Core ML's ``_OperatorsSupportedForCoreMLBackend.log_once`` (which logs a message once
  per partitioner, so only the first node with a given reason would show in the log).

:func:`capture` collects all of them for the calls made in the current context, keyed by the
node object. It wraps those helpers (once per process, for the modules already imported): each
wrapper records ``(node, reason)`` into the capture active in the calling context (a
:class:`contextvars.ContextVar`, so concurrent requests on other threads never see each
other's reasons), then calls the original with the same arguments and returns its result, so
the hook's behaviour and result are unchanged. Outside a capture the wrappers only call the
original. Recording reads the call's arguments, not ``WhyNoPartition``'s shared ``node``
attribute (XNNPACK holds one ``WhyNoPartition`` per module), so it is thread-safe too.

:func:`rejections` then states a reason for every untagged call_function node of the
partitioned program: what was captured, or, when the partitioner said nothing about the
node, a reason derived by the server (:func:`derived_reason`). A reason is never empty.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import operator
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

DELEGATION_TAG = "delegation_tag"

PARTITIONER = pb.REJECTION_SOURCE_PARTITIONER
BACKEND_LOG = pb.REJECTION_SOURCE_BACKEND_LOG
DERIVED = pb.REJECTION_SOURCE_DERIVED

#: Readable names of well-known backends, for derived reasons.
_BACKEND_LABELS = {
    "XnnpackBackend": "XNNPACK",
    "VulkanBackend": "Vulkan",
    "CoreMLBackend": "Core ML",
}


class Capture:
    """The reasons said about nodes during one capture: node -> [(reason, source)], each
    distinct pair once, in the order they were said."""

    def __init__(self) -> None:
        self.said: dict[torch.fx.Node, list[tuple[str, int]]] = {}

    def add(self, node: object, reason: object, source: int) -> None:
        """Record ``reason`` for ``node`` (ignored unless ``node`` is an fx node and the
        reason a non-empty text)."""
        if not isinstance(node, torch.fx.Node):
            return
        text = str(reason).strip() if reason is not None else ""
        if not text:
            return
        entries = self.said.setdefault(node, [])
        if (text, source) not in entries:
            entries.append((text, source))


_CURRENT: contextvars.ContextVar[Capture | None] = contextvars.ContextVar(
    "remote_partitioner_reasons", default=None
)
#: The node Core ML's support check is looking at (its log messages do not name the node).
_CHECKING: contextvars.ContextVar[torch.fx.Node | None] = contextvars.ContextVar(
    "remote_partitioner_checking", default=None
)


def _record(node: object, reason: object, source: int) -> None:
    current = _CURRENT.get()
    if current is not None:
        current.add(node, reason, source)


# ---------------------------------------------------------------------- the wrapped helpers


def _why_no_partition(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, node: Any, reason: Any, *args: Any, **kwargs: Any) -> Any:
        _record(node, reason, PARTITIONER)
        return original(self, node, reason, *args, **kwargs)

    return call


def _vulkan_log_skip(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, node: Any, reason: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(node, "op", None) == "call_function":  # what log_skip itself logs
            _record(node, reason, BACKEND_LOG)
        return original(self, node, reason, *args, **kwargs)

    return call


def _coreml_is_node_supported(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, submodules: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
        token = _CHECKING.set(node if isinstance(node, torch.fx.Node) else None)
        try:
            return original(self, submodules, node, *args, **kwargs)
        finally:
            _CHECKING.reset(token)

    return call


def _coreml_log_once(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, msg: Any, *args: Any, **kwargs: Any) -> Any:
        _record(_CHECKING.get(), msg, BACKEND_LOG)
        return original(self, msg, *args, **kwargs)

    return call


#: (module, class, method, wrapper factory): the helpers whose calls are captured.
_PATCHES: tuple[tuple[str, str, str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    ("executorch.exir.backend.utils", "WhyNoPartition", "__call__", _why_no_partition),
    ("executorch.exir.backend.utils", "WhyNoPartitionReporter", "report_reject",
     _why_no_partition),
    ("executorch.backends.vulkan.partitioner.vulkan_partitioner", "VulkanSupportedOperators",
     "log_skip", _vulkan_log_skip),
    ("executorch.backends.apple.coreml.partition.coreml_partitioner",
     "_OperatorsSupportedForCoreMLBackend", "is_node_supported", _coreml_is_node_supported),
    ("executorch.backends.apple.coreml.partition.coreml_partitioner",
     "_OperatorsSupportedForCoreMLBackend", "log_once", _coreml_log_once),
)
_MARK = "__remote_partitioner_reasons__"
_install_lock = threading.Lock()


def install() -> None:
    """Wrap the helpers of :data:`_PATCHES` whose modules are imported (idempotent: each is
    wrapped once per process; a module imported later is wrapped at the next call). Never
    imports a backend."""
    with _install_lock:
        for module_name, class_name, method, factory in _PATCHES:
            module = sys.modules.get(module_name)
            cls = getattr(module, class_name, None) if module is not None else None
            original = getattr(cls, method, None) if cls is not None else None
            if original is None or getattr(original, _MARK, False):
                continue
            wrapped = factory(original)
            setattr(wrapped, _MARK, True)
            setattr(cls, method, wrapped)


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Collect the reasons said in this context while the block runs (see the module doc)."""
    install()
    current = Capture()
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)


# ---------------------------------------------------------------------- stating the reasons


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A call_function node left outside every delegate, and why (never an empty reason)."""

    graph: str
    name: str
    target: str
    reason: str
    source: int


def target_label(node: torch.fx.Node) -> str:
    """A node's target as reports show it: qualified, without the "edge." prefix."""
    return codec.target_name(node.target).removeprefix("edge.")


def backend_id(partitioner: Partitioner) -> str:
    """The backend a partitioner delegates to, when it states one ("" otherwise)."""
    spec = getattr(partitioner, "delegation_spec", None)
    return str(getattr(spec, "backend_id", "") or "")


def derived_reason(partitioner: Partitioner, node: torch.fx.Node) -> str:
    """Why ``node`` stayed out, when ``partitioner`` said nothing about it (never empty).

    A configuration-based partitioner (XNNPACK) with no config for the node's target: "no
    XNNPACK config supports aten.cumsum.default". A getitem of a node left out: it reads that
    node's output. Otherwise: "not in a partition (the XnnpackPartitioner gave no reason)".
    """
    name = type(partitioner).__name__
    backend = backend_id(partitioner)
    label = _BACKEND_LABELS.get(backend, backend or name)
    if node.target is operator.getitem and node.args and isinstance(node.args[0], torch.fx.Node):
        source = node.args[0]
        if DELEGATION_TAG not in source.meta:
            return f"reads an output of {source.name}, which is not delegated either"
    configs = getattr(partitioner, "target_partitioner_configs", None)
    target_name = getattr(node.target, "__name__", None)
    if isinstance(configs, dict) and isinstance(target_name, str):
        from executorch.exir.backend.canonical_partitioners.config_partitioner import (
            format_target_name,
        )

        if format_target_name(target_name) not in configs:
            return f"no {label} config supports {target_label(node)}"
    return f"not in a partition (the {name} gave no reason)"


def rejections(
    partitioner: Partitioner, ep: ExportedProgram, said: Capture
) -> list[Rejection]:
    """Every call_function node of ``ep`` (every graph, in graph order) with no delegation tag,
    with its reason: the distinct reasons captured for it joined with "; " (the first one's
    source), or :func:`derived_reason`."""
    out = []
    for path, gm in codec.graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.meta.get(DELEGATION_TAG):
                continue
            entries = said.said.get(node)
            if entries:
                reason = "; ".join(text for text, _ in entries)
                source = entries[0][1]
            else:
                reason, source = derived_reason(partitioner, node), DERIVED
            out.append(Rejection(path, node.name, target_label(node), reason, source))
    return out


def to_message(r: Rejection) -> pb.NodeRejection:
    """A :class:`Rejection` as its wire message."""
    return pb.NodeRejection(
        node=pb.NodeRef(graph=r.graph, name=r.name), target=r.target, reason=r.reason,
        source=r.source,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------- inside a lowering


@dataclasses.dataclass
class PartitionCall:
    """One ``partition()`` call made during a lowering: its partitioner and the rejections of
    the program it tagged, by (graph path, node name)."""

    partitioner: Partitioner
    rejected: dict[tuple[str, str], Rejection]


@contextlib.contextmanager
def recording(partitioners: list[Partitioner]) -> Iterator[list[PartitionCall]]:
    """While the block runs, every ``partition()`` call on one of ``partitioners`` (fresh
    instances of this request) is captured; the calls are appended, in call order, to the
    list yielded. Each instance's ``partition`` is shadowed by an instance attribute that
    calls the class's method with the same argument and returns its result unchanged; the
    attribute is removed afterwards."""
    calls: list[PartitionCall] = []

    def wrap(p: Partitioner) -> Callable[[ExportedProgram], Any]:
        original = p.partition

        def partition(exported_program: ExportedProgram) -> Any:
            with capture() as said:
                result = original(exported_program)
            tagged = getattr(result, "tagged_exported_program", None)
            if isinstance(tagged, ExportedProgram):
                found = rejections(p, tagged, said)
                calls.append(PartitionCall(p, {(r.graph, r.name): r for r in found}))
            return result

        return partition

    for p in partitioners:
        p.partition = wrap(p)  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        for p in partitioners:
            with contextlib.suppress(AttributeError):
                del p.partition


__all__ = [
    "BACKEND_LOG",
    "DERIVED",
    "PARTITIONER",
    "Capture",
    "PartitionCall",
    "Rejection",
    "backend_id",
    "capture",
    "derived_reason",
    "install",
    "recording",
    "rejections",
    "target_label",
    "to_message",
]
