"""Build ExecuTorch backends' fusion pattern graphs once per process.

Some of ExecuTorch's partitioners and backends build small pattern graphs with
``torch.export`` (and ``to_edge``) on every call, whatever the program they are given, and
that can be most of the call: Vulkan's rotary-embedding patterns are about 80 % of a small
model's ``VulkanPartitioner.partition`` plus ``VulkanBackend.preprocess`` on 2 cores.
A pattern graph depends only on the pattern module's code, the values it closes over and the
shapes and dtypes of its example inputs (:func:`pattern_key`), so a process can build each
once and hand out deep copies afterwards: the same graphs, node names and targets as a fresh
build. The example inputs are still drawn by the backend's own code (``torch.randn``), so
torch's random generator moves exactly as without the memo; a caller's generator state, which
the server carries to the hooks and back, is untouched by it.

Contract of every memo here: the first use of a key gets what the backend's own calls made
(a miss is exactly the unmemoized call); each later use gets a deep copy of it, taken when it
was made, before any caller could change it. A pattern without a key (one holding parameters,
buffers or submodules, or whose key does not hash) is built every time. Memos are thread-safe:
a server runs hooks concurrently.

The memos, each installed by a function that returns the function putting the unmemoized code
back (a no-op when that memo was already installed), or None when its backend does not import:
:func:`memoize_vulkan_pattern_graphs` (the Vulkan partitioner's and preprocess's patterns),
:func:`memoize_xnnpack_pattern_graphs` and :func:`memoize_coreml_pattern_graphs` (the XNNPACK
and Core ML PT2E quantizers' patterns, which the ``Quantize`` RPC runs); :func:`install_all`
installs the three. ``remote-partitioner serve`` installs them in its own process
(``--no-pattern-memo`` turns them off), and so does ``scripts/conformance.py`` in its runner;
:func:`~remote_partitioner.server.app.create_server` does not, as it may run in a process
whose modules are not the server's to patch. :func:`memoize_torchao_qat_pattern_graphs`
(torchao's own QAT conv-batch norm patterns, which ``prepare_qat_pt2e`` and ``convert_pt2e``
export where the program is quantized, on the client) is for a client process's own use: the
tests install it around their QAT comparisons. ``tests/test_pattern_memo.py`` checks that the
graphs, quantized programs and the generator are the same with and without them, and that a
memoized server lowers to the local, unmemoized ``.pte``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any


def pattern_key(pattern: Any, example_inputs: Any, *extra: Any) -> tuple[Any, ...] | None:
    """The key of building a graph from the pattern module ``pattern`` with
    ``example_inputs``: the code of its class's functions and the values they close over,
    the class's other attributes, the instance's own attributes, the shapes, dtypes, layouts
    and ``requires_grad`` of the example inputs, and ``extra``.

    Returns None (build it every time) when the module holds parameters, buffers or
    submodules, its class derives from another class than ``torch.nn.Module``, an example
    input is not a tensor, or the key does not hash.
    """
    import torch

    cls = type(pattern)
    if (cls.__bases__ != (torch.nn.Module,)
            or pattern._parameters or pattern._buffers or pattern._modules
            or not all(isinstance(x, torch.Tensor) for x in example_inputs)):
        return None

    def members(namespace: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """A namespace's items, a function by its code and the values it closes over
        (``super()`` closes over the class itself: a class made per call is the same pattern
        each time)."""
        items = []
        for name, value in sorted(namespace.items()):
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if callable(function) and hasattr(function, "__code__"):
                value = (function.__code__,
                         tuple("__class__" if c.cell_contents is cls else c.cell_contents
                               for c in function.__closure__ or ()))
            items.append((name, value))
        return tuple(items)

    # The instance's own attributes (torchao's WrapperModule holds the pattern function).
    attributes = {k: v for k, v in pattern.__dict__.items()
                  if k not in torch.nn.Module().__dict__}
    try:
        key = (members(vars(cls)), members(attributes),
               tuple(_tensor_key(x) for x in example_inputs),
               extra)
        hash(key)
    except (TypeError, ValueError):  # an unhashable value, or a closure cell not yet filled
        return None
    return key


def _tensor_key(x: Any) -> tuple[Any, ...]:
    """What of an input tensor a traced pattern graph depends on: its shape, dtype, layout and
    ``requires_grad``, not its values."""
    return (x.shape, x.dtype, x.layout, x.requires_grad)


class GraphMemo:
    """Graphs by key, thread-safe: the first use of a key gets what ``make`` made; each later
    use a deep copy of it, taken when it was made (before the caller changes it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._graphs: dict[tuple[Any, ...], Any] = {}

    def get(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """The graph of ``key``, made by ``make()`` on a miss (outside the lock: two threads
        that miss together both make it, and the first one stored is kept)."""
        with self._lock:
            hit = self._graphs.get(key)
        if hit is not None:
            return copy.deepcopy(hit)
        made = make()
        with self._lock:
            self._graphs.setdefault(key, copy.deepcopy(made))
        return made


def memoized_pattern_export(export: Callable[..., Any]) -> Callable[..., Any]:
    """``export(pattern, example_inputs, is_cuda=False, **kwargs)``, a quantizer's function
    that exports a pattern module, memoized by :func:`pattern_key`. Returns ``export`` itself
    if it is already memoized.

    ``kwargs`` are the pattern's keyword inputs, which ``export`` hands to ``torch.export`` as
    the example inputs are (torchao's QAT patterns take their scales, zero points and conv
    bias so): they are in the key by :func:`_keyword_inputs_key`."""
    if getattr(export, "memoized", False):
        return export
    graphs = GraphMemo()

    def memoized(pattern: Any, example_inputs: Any, is_cuda: bool = False, **kwargs: Any) -> Any:
        key = pattern_key(pattern, example_inputs, is_cuda, _keyword_inputs_key(kwargs))

        # A miss (or a pattern without a key) is the quantizer's own call, exactly.
        def call() -> Any:
            return export(pattern, example_inputs, is_cuda, **kwargs)

        return call() if key is None else graphs.get(key, call)

    memoized.memoized = True  # type: ignore[attr-defined]
    return memoized


def _keyword_inputs_key(kwargs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The key of a pattern's keyword inputs: a tensor by its shape, dtype, layout and
    ``requires_grad`` (``torch.export`` traces it as an input, whatever its values, as it does
    the example inputs: :func:`pattern_key`), any other value by itself."""
    import torch

    return tuple(
        (name, ("tensor", _tensor_key(value)) if isinstance(value, torch.Tensor) else value)
        for name, value in sorted(kwargs.items())
    )


class _PendingExport:
    """What the memoized ``export`` of :func:`memoize_vulkan_pattern_graphs` returns: the
    export call, made only when ``to_edge`` misses."""

    def __init__(self, key: tuple[Any, ...], call: Callable[[], Any]) -> None:
        self.key = key
        self.call = call


def memoize_vulkan_pattern_graphs() -> Callable[[], None] | None:
    """Build each of Vulkan's fusion pattern graphs once per process; returns the function
    that puts the unmemoized ones back (a no-op when the memo was already installed), or
    None when the Vulkan backend does not import.

    ``VulkanPartitioner.partition`` and ``VulkanBackend.preprocess`` both call every
    registered pattern's graph function (``patterns.all_fusable_graph_patterns``,
    ``replace_all_fusable_subgraphs``), and the two rotary-embedding ones (``rope``,
    ``rope_hf``) export and ``to_edge`` three small modules on each call. Their
    ``lru_cache`` does not apply: it wraps the function after ``register_pattern_graph``
    registered the bare one. Here the two modules' ``export`` and ``to_edge`` are memoized
    together, keyed as in :func:`pattern_key` plus ``to_edge``'s arguments: an ``export``
    whose ``to_edge`` hits the memo is never run.
    """
    try:
        from executorch.backends.vulkan.patterns import rope, rope_hf
    except ImportError:
        return None
    modules = (rope, rope_hf)
    if getattr(rope.to_edge, "memoized", False):
        return lambda: None
    originals = [(m, m.export, m.to_edge) for m in modules]
    real_export, real_to_edge = rope.export, rope.to_edge
    if not all(m.export is real_export and m.to_edge is real_to_edge for m in modules):
        raise RuntimeError("Vulkan's rope patterns no longer share export and to_edge: the "
                           "pattern memo does not know this ExecuTorch")
    edges = GraphMemo()

    def export(module: Any, args: tuple[Any, ...], **kwargs: Any) -> Any:
        key = pattern_key(module, args, tuple(sorted(kwargs.items())))
        if key is None:
            return real_export(module, args, **kwargs)
        return _PendingExport(key, lambda: real_export(module, args, **kwargs))

    def to_edge(program: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(program, _PendingExport):
            return real_to_edge(program, *args, **kwargs)
        key = (program.key, repr(args), repr(sorted(kwargs.items())))
        # A miss is the pattern function's own calls, exactly: it gets what they made.
        return edges.get(key, lambda: real_to_edge(program.call(), *args, **kwargs))

    to_edge.memoized = True  # type: ignore[attr-defined]
    for m in modules:
        m.export, m.to_edge = export, to_edge

    def restore() -> None:
        for m, e, t in originals:
            m.export, m.to_edge = e, t

    return restore


def memoize_coreml_pattern_graphs() -> Callable[[], None] | None:
    """Export each of the Core ML PT2E quantizer's pattern graphs once per process; returns the
    function that puts the unmemoized export back (a no-op when the memo was already
    installed), or None when the quantizer does not import.

    ``CoreMLQuantizer.annotate`` exports about 250 small pattern modules with
    ``torch.export`` on every ``prepare_pt2e`` (``_coreml_quantizer_utils._get_aten_graph_module``):
    measured, 97 % of a conformance ``coreml_static_int8`` test (about 60 s a lowering on 2
    cores, twice per test; about 150 s per ``prepare_pt2e`` on one core). A pattern's graph
    depends only on its module's code, the values its ``forward`` closes over (the operator
    and activation functions, flags) and the shapes and dtypes of its example inputs
    (:func:`pattern_key`). The example inputs are still drawn by the quantizer
    (``torch.randn``), so the random generator moves as without the memo. It changes only the
    quantize stage (``annotate``), which runs before any partitioner.
    ``tests/test_conformance.py`` checks that a quantized program is the same with and without
    it, and ``tests/test_annotations.py::test_coreml`` (in ``make test``) its miss against its
    hits.
    """
    try:
        from executorch.backends.apple.coreml.quantizer import _coreml_quantizer_utils as utils
    except ImportError:
        return None
    return _memoize_module_export(utils, "_get_aten_graph_module")


def memoize_xnnpack_pattern_graphs() -> Callable[[], None] | None:
    """Export each of the XNNPACK PT2E quantizer's conv-batch norm pattern graphs once per
    process; returns the function that puts the unmemoized export back (a no-op when the memo
    was already installed), or None when the quantizer does not import.

    ``XNNPACKQuantizer.annotate`` exports 4 to 8 conv-bn[-relu] patterns with ``torch.export``
    (torchao's ``_get_aten_graph_module_for_pattern``, as ``xnnpack_quantizer_utils`` holds
    it) on every ``prepare_pt2e``, whatever the model: measured, 64 % of a conformance
    ``xnnpack_static_int8_per_channel`` test (about 11 of 18 s a lowering on 2 cores).
    Memoized as :func:`memoize_coreml_pattern_graphs` is (the patterns are torchao
    ``WrapperModule`` instances holding a closure over the conv function and the relu flags);
    the quantize stage only. ``tests/test_pattern_memo.py`` and ``tests/test_conformance.py``
    check that a quantized program and the generator are the same with and without it.
    """
    try:
        from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils as utils
    except ImportError:
        return None
    return _memoize_module_export(utils, "_get_aten_graph_module_for_pattern")


def memoize_torchao_qat_pattern_graphs() -> Callable[[], None] | None:
    """Export each of torchao's QAT conv-batch norm pattern graphs once per process; returns
    the function that puts the unmemoized export back (a no-op when the memo was already
    installed), or None when torchao does not import.

    ``prepare_qat_pt2e`` (``_fuse_conv_bn_qat``) and ``convert_pt2e`` (``_fold_conv_bn_qat``,
    for a program with batch norm) export their conv-bn patterns with ``torch.export`` on
    every call (torchao's ``_get_aten_graph_module_for_pattern``, as ``qat_utils`` holds it;
    ``convert_pt2e`` alone exports 96 for any program with batch norm: conv1d, conv2d and their
    transposes, 12 flag combinations each, a match and a replacement pattern, with each
    per-channel pattern's scales, zero points and conv bias as keyword inputs): measured, 75 % of
    ``tests/test_quantize.py::test_qat_gives_the_local_program``. Memoized as
    :func:`memoize_xnnpack_pattern_graphs` is. These run where the program is quantized, on
    the client, never in the server: :func:`install_all` leaves this memo out. The QAT tests
    install it around a local-then-remote comparison (the local run its misses, the remote run
    its hits), and ``tests/test_pattern_memo.py`` checks that a hit is the graph a fresh
    export makes.
    """
    try:
        from torchao.quantization.pt2e import qat_utils
    except ImportError:
        return None
    return _memoize_module_export(qat_utils, "_get_aten_graph_module_for_pattern")


def _memoize_module_export(module: Any, name: str) -> Callable[[], None]:
    """Replaces ``module.name`` (a quantizer's pattern export, called through the module's
    globals) by its :func:`memoized_pattern_export`; returns what puts it back (a no-op when
    it already was memoized)."""
    original = getattr(module, name)
    if getattr(original, "memoized", False):
        return lambda: None
    setattr(module, name, memoized_pattern_export(original))

    def restore() -> None:
        setattr(module, name, original)

    return restore


def install_all() -> list[str]:
    """Installs every memo here whose backend imports (:func:`memoize_vulkan_pattern_graphs`,
    :func:`memoize_xnnpack_pattern_graphs`, :func:`memoize_coreml_pattern_graphs`); returns
    the names of the backends memoized ("vulkan", "xnnpack", "coreml"; those already memoized
    count). The memos are never taken out again: this is for a process of its own (a server).
    The root logger is left as it was (importing the backends reconfigures it)."""
    from remote_partitioner.server.registry import _root_logging_kept

    installers = (
        ("vulkan", memoize_vulkan_pattern_graphs),
        ("xnnpack", memoize_xnnpack_pattern_graphs),
        ("coreml", memoize_coreml_pattern_graphs),
    )
    with _root_logging_kept():
        return [name for name, install in installers if install() is not None]
