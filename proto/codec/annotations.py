"""Quantization annotations on the wire: torchao's ``QuantizationAnnotation`` <-> ``Annotations``.

A PT2E quantizer's ``annotate`` writes a torchao ``QuantizationAnnotation`` into the metadata of
the nodes it quantizes (key ``Q_ANNOTATION_KEY``). Its specs hold observer and fake-quantize
*constructors* (a class, or torchao's ``with_args`` partial over one), and torchao's ``prepare``
reads the objects' identity: specs and constructors shared between positions are one object.
The ``Annotations`` message therefore states them as tables:

* ``constructors``: one entry per distinct constructor object, in post-order (a partial's
  ``func``, keyword and ``callable_args`` constructors come before it), so every entry refers
  only to earlier ones;
* ``specs``: one entry per distinct spec object (``id()``-based: equal but distinct objects stay
  distinct);
* ``nodes``: one entry per annotated node, in graph order; nodes sharing one annotation object
  carry the same ``object`` index.

Nodes are named by ``node.name``: the module the annotations are applied to must have the
annotated module's node names (the server annotates a copy of the client's module).

Nothing crosses as code. A constructor crosses as the qualified name of a class on
:data:`ALLOWED_CONSTRUCTORS` (torchao's observer and fake-quantize classes), a
``derive_qparams_fn`` as the qualified name of a function on :data:`ALLOWED_DERIVE_FUNCTIONS`;
a name received is only ever looked up in those tables, never imported. Dtypes and qschemes
cross as their ``str()`` (``"torch.int8"``, ``"torch.per_tensor_affine"``) and are looked up in
tables of torch's own ``torch.dtype`` and ``torch.qscheme`` objects.

Everything torchao's ``prepare``, ``prepare_qat_pt2e`` (its conv-bn fusion) and ``convert``
read from an annotation crosses: ``input_qspec_map`` (keys and their order, a ``None`` value
included), ``output_qspec``, ``allow_implicit_sharing`` and ``_annotated``; every field of the
four spec classes; a constructor's class chain, keywords (in order), ``callable_args`` and the
``__module__`` attribute ``FakeQuantize.with_args`` sets on its wrapper. Anything else (a
subclass of the annotation or a spec class, an extra attribute, a keyword of another type) is
refused rather than dropped.

torchao is imported on first use, not with this module: importing the codec stays as cheap as
it was for the callers that never see an annotation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from remote_partitioner.proto.codec.derive_functions import DERIVE_FUNCTIONS, captures_nothing
from remote_partitioner.proto.program_errors import ProgramDecodeError, UnrepresentableMeta
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer.quantizer import QuantizationAnnotation

__all__ = [
    "ALLOWED_CONSTRUCTORS",
    "ALLOWED_DERIVE_FUNCTIONS",
    "UnknownConstructor",
    "apply_annotations",
    "encode_annotations",
]

#: The metadata key torchao's quantizers write (``torchao...quantizer.Q_ANNOTATION_KEY``).
Q_ANNOTATION_KEY = "quantization_annotation"

# The observer and fake-quantize classes that may cross, by module: every concrete subclass of
# torchao's ``ObserverBase`` / ``FakeQuantizeBase`` that torchao.quantization.pt2e.observer and
# .fake_quantize define (tests/test_annotations.py checks that this list is exactly that set, so
# a torchao upgrade that adds or removes one is noticed). XNNPACKQuantizer uses HistogramObserver,
# MinMaxObserver, PerChannelMinMaxObserver, PlaceholderObserver, MovingAverageMinMaxObserver,
# MovingAveragePerChannelMinMaxObserver, FakeQuantize and FusedMovingAvgObsFakeQuantize;
# VulkanQuantizer PerChannelMinMaxObserver and PlaceholderObserver; CoreMLQuantizer FakeQuantize
# over MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver or
# MovingAveragePerChannelMinMaxObserver (and FixedQParams specs, whose observers torchao's
# prepare creates itself): all of them come from these two modules, none from torch.ao.
_ALLOWED_CLASS_NAMES: Mapping[str, tuple[str, ...]] = {
    "torchao.quantization.pt2e.observer": (
        "FixedQParamsObserver",
        "HistogramObserver",
        "MinMaxObserver",
        "MovingAverageMinMaxObserver",
        "MovingAveragePerChannelMinMaxObserver",
        "NoopObserver",
        "PerChannelMinMaxObserver",
        "PlaceholderObserver",
        "RecordingObserver",
        "ReuseInputObserver",
    ),
    "torchao.quantization.pt2e.fake_quantize": (
        "AffineFakeQuantize",
        "FakeQuantize",
        "FixedQParamsFakeQuantize",
        "FusedMovingAvgObsFakeQuantize",
    ),
}


def _allowed_classes() -> dict[str, Any]:
    """The allow-list's table, built on first use (it imports torchao)."""
    from torchao.quantization.pt2e import fake_quantize, observer

    modules = {observer.__name__: observer, fake_quantize.__name__: fake_quantize}
    table: dict[str, Any] = {}
    for module_name, class_names in _ALLOWED_CLASS_NAMES.items():
        for class_name in class_names:
            cls = vars(modules[module_name])[class_name]
            table[_qualified_name(cls)] = cls
    return table


class _LazyTable(Mapping[str, Any]):
    """A read-only mapping whose contents ``build`` computes on first access."""

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = build
        self._table: Mapping[str, Any] | None = None

    def _get(self) -> Mapping[str, Any]:
        if self._table is None:
            self._table = MappingProxyType(self._build())
        return self._table

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._get())!r})"


#: Qualified name (``f"{cls.__module__}.{cls.__qualname__}"``) -> observer or fake-quantize
#: class: the only classes a ``Constructor`` may name, in either direction.
ALLOWED_CONSTRUCTORS: Mapping[str, Any] = _LazyTable(_allowed_classes)

#: Qualified name -> the implementation of a ``DerivedQuantizationSpec``'s ``derive_qparams_fn``
#: that the client runs (:mod:`.derive_functions`: Arm's bias functions; XNNPACK, Vulkan and
#: Core ML write no derived spec). The server accepts a function under its name if it is that
#: implementation or a plain function that captures nothing (the backend's own). Read at call
#: time, so a hosting process (or a test) may replace it.
ALLOWED_DERIVE_FUNCTIONS: Mapping[str, Callable[..., Any]] = DERIVE_FUNCTIONS

#: ``str(dtype)`` -> dtype, for every ``torch.dtype`` torch exposes (``"torch.int8"``).
_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
)

#: ``str(qscheme)`` -> qscheme, for every ``torch.qscheme`` torch exposes.
_QSCHEMES: Mapping[str, torch.qscheme] = MappingProxyType(
    {str(v): v for v in vars(torch).values() if isinstance(v, torch.qscheme)}
)

_INT64 = range(-(2**63), 2**63)


class UnknownConstructor(UnrepresentableMeta):
    """A constructor (observer or fake-quantize class) or ``derive_qparams_fn`` that is not on
    the allow-list: :data:`ALLOWED_CONSTRUCTORS` or :data:`ALLOWED_DERIVE_FUNCTIONS`.

    ``name`` is its qualified name; ``str()`` names it, where it was met, and the allow-list.
    """

    def __init__(self, name: str, where: str = "", *, derive_function: bool = False) -> None:
        table = "ALLOWED_DERIVE_FUNCTIONS" if derive_function else "ALLOWED_CONSTRUCTORS"
        what = "derive_qparams_fn" if derive_function else "observer or fake-quantize constructor"
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{what} {name} is not on the allow-list ({table})")
        self.name = name


def _qualified_name(obj: Any) -> str:
    """``f"{obj.__module__}.{obj.__qualname__}"`` for a class or function; for anything else a
    description naming its type."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    cls = type(obj)
    return f"<a {cls.__module__}.{cls.__qualname__} instance>"


# --------------------------------------------------------------------------------------------
# Encoding


def encode_annotations(gm: torch.fx.GraphModule) -> pb.Annotations:
    """The ``QuantizationAnnotation`` of every node of ``gm.graph``, in graph order, as tables
    that keep object identity (see the module docstring).

    Raises :class:`UnknownConstructor` naming the qualified name of an observer or fake-quantize
    constructor, or ``derive_qparams_fn``, that is not on the allow-list, and
    :class:`UnrepresentableMeta` naming the node and field of anything else it cannot state (an
    annotation or spec of another class or with extra attributes, a keyword value of an
    unsupported type, a node or edge that is not in ``gm.graph``, ...). ``gm`` is not modified.
    """
    return _Encoder(gm).encode()


class _Encoder:
    """One ``encode_annotations`` call: the tables built so far, keyed by ``id()``.

    The objects keyed are reachable from ``gm`` for the whole call, so their ids are not reused.
    """

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        from torchao.quantization.pt2e import quantizer as q
        from torchao.quantization.pt2e.observer import PartialWrapper

        self._q = q
        self._partial_wrapper: type = PartialWrapper
        self._graph = gm.graph
        self._nodes: dict[str, torch.fx.Node] = {n.name: n for n in gm.graph.nodes}
        self._msg = pb.Annotations()
        self._constructors: dict[int, int] = {}
        self._specs: dict[int, int] = {}
        self._objects: dict[int, int] = {}
        self._in_progress: set[int] = set()

    def encode(self) -> pb.Annotations:
        for node in self._graph.nodes:
            if Q_ANNOTATION_KEY in node.meta:
                self._msg.nodes.append(self._annotation(node, node.meta[Q_ANNOTATION_KEY]))
        return self._msg

    # Annotations ---------------------------------------------------------------------------

    def _annotation(self, node: torch.fx.Node, ann: Any) -> pb.NodeAnnotation:
        where = f"node {node.name!r}: {Q_ANNOTATION_KEY}"
        if type(ann) is not self._q.QuantizationAnnotation:
            raise UnrepresentableMeta(
                f"{where}: a {_qualified_name(type(ann))} cannot be represented on the wire "
                "(only torchao's QuantizationAnnotation)"
            )
        _check_attributes(ann, where)
        entry = pb.NodeAnnotation(
            node=node.name,
            allow_implicit_sharing=_bool(
                ann.allow_implicit_sharing, f"{where}.allow_implicit_sharing"
            ),
            annotated=_bool(ann._annotated, f"{where}._annotated"),
            object=self._objects.setdefault(id(ann), len(self._objects)),
        )
        if type(ann.input_qspec_map) is not dict:
            raise UnrepresentableMeta(f"{where}.input_qspec_map: not a dict")
        for input_node, spec in ann.input_qspec_map.items():
            field = f"{where}.input_qspec_map[{self._node_name(input_node, where)!r}]"
            item = entry.inputs.add(input=input_node.name)
            if spec is not None:
                item.spec = self._spec(spec, field)
        if ann.output_qspec is not None:
            entry.output_spec = self._spec(ann.output_qspec, f"{where}.output_qspec")
        return entry

    def _node_name(self, node: Any, where: str) -> str:
        """``node``'s name if it is a node of the graph being encoded."""
        if not isinstance(node, torch.fx.Node):
            raise UnrepresentableMeta(
                f"{where}: {_qualified_name(node)} where a node of the graph was expected"
            )
        if self._nodes.get(node.name) is not node:
            raise UnrepresentableMeta(f"{where}: node {node.name!r} is not in the graph")
        return node.name

    def _edge_or_node(self, value: Any, where: str) -> pb.EdgeOrNode:
        if type(value) is tuple:
            if len(value) != 2:
                raise UnrepresentableMeta(f"{where}: an edge of {len(value)} nodes")
            return pb.EdgeOrNode(
                edge=pb.Edge(
                    input=self._node_name(value[0], where), user=self._node_name(value[1], where)
                )
            )
        return pb.EdgeOrNode(node=self._node_name(value, where))

    # Specs ---------------------------------------------------------------------------------

    def _spec(self, spec: Any, where: str) -> int:
        index = self._specs.get(id(spec))
        if index is not None:
            return index
        q = self._q
        kind = type(spec)
        if kind not in (
            q.QuantizationSpec,
            q.FixedQParamsQuantizationSpec,
            q.SharedQuantizationSpec,
            q.DerivedQuantizationSpec,
        ):
            raise UnrepresentableMeta(
                f"{where}: a quantization spec of class {_qualified_name(kind)} cannot be "
                "represented on the wire"
            )
        _check_attributes(spec, where)
        if kind is q.QuantizationSpec:
            message = pb.QuantSpec(
                quantization=pb.QuantizationSpec(
                    dtype=_dtype(spec.dtype, f"{where}.dtype"),
                    constructor=self._constructor(
                        spec.observer_or_fake_quant_ctr, f"{where}.observer_or_fake_quant_ctr"
                    ),
                    quant_min=_optional_int(spec.quant_min, f"{where}.quant_min"),
                    quant_max=_optional_int(spec.quant_max, f"{where}.quant_max"),
                    qscheme=_optional_qscheme(spec.qscheme, f"{where}.qscheme"),
                    ch_axis=_optional_int(spec.ch_axis, f"{where}.ch_axis"),
                    is_dynamic=_bool(spec.is_dynamic, f"{where}.is_dynamic"),
                )
            )
        elif kind is q.FixedQParamsQuantizationSpec:
            if type(spec.scale) is not float:
                raise UnrepresentableMeta(
                    f"{where}.scale: a {_qualified_name(type(spec.scale))}, not a float"
                )
            message = pb.QuantSpec(
                fixed=pb.FixedQParamsSpec(
                    dtype=_dtype(spec.dtype, f"{where}.dtype"),
                    scale=spec.scale,
                    zero_point=_int(spec.zero_point, f"{where}.zero_point"),
                    quant_min=_optional_int(spec.quant_min, f"{where}.quant_min"),
                    quant_max=_optional_int(spec.quant_max, f"{where}.quant_max"),
                    qscheme=_optional_qscheme(spec.qscheme, f"{where}.qscheme"),
                    is_dynamic=_bool(spec.is_dynamic, f"{where}.is_dynamic"),
                )
            )
        elif kind is q.SharedQuantizationSpec:
            message = pb.QuantSpec(
                shared=pb.SharedSpec(
                    edge_or_node=self._edge_or_node(spec.edge_or_node, f"{where}.edge_or_node")
                )
            )
        else:
            if type(spec.derived_from) not in (list, tuple):
                raise UnrepresentableMeta(f"{where}.derived_from: not a list or tuple")
            fn = spec.derive_qparams_fn
            fn_name = _qualified_name(fn)
            allowed = ALLOWED_DERIVE_FUNCTIONS.get(fn_name)
            if allowed is None or (allowed is not fn and not captures_nothing(fn)):
                raise UnknownConstructor(
                    fn_name, f"{where}.derive_qparams_fn", derive_function=True
                )
            message = pb.QuantSpec(
                derived=pb.DerivedSpec(
                    derived_from=[
                        self._edge_or_node(v, f"{where}.derived_from[{i}]")
                        for i, v in enumerate(spec.derived_from)
                    ],
                    derive_qparams_fn=fn_name,
                    derived_from_tuple=type(spec.derived_from) is tuple,
                    dtype=_dtype(spec.dtype, f"{where}.dtype"),
                    quant_min=_optional_int(spec.quant_min, f"{where}.quant_min"),
                    quant_max=_optional_int(spec.quant_max, f"{where}.quant_max"),
                    qscheme=_optional_qscheme(spec.qscheme, f"{where}.qscheme"),
                    ch_axis=_optional_int(spec.ch_axis, f"{where}.ch_axis"),
                    is_dynamic=_bool(spec.is_dynamic, f"{where}.is_dynamic"),
                )
            )
        index = len(self._msg.specs)
        self._msg.specs.append(message)
        self._specs[id(spec)] = index
        return index

    # Constructors --------------------------------------------------------------------------

    def _constructor(self, ctr: Any, where: str) -> int:
        index = self._constructors.get(id(ctr))
        if index is not None:
            return index
        if isinstance(ctr, type):
            name = _qualified_name(ctr)
            if ALLOWED_CONSTRUCTORS.get(name) is not ctr:
                raise UnknownConstructor(name, where)
            message = pb.Constructor(class_name=name)
        elif type(ctr) is self._partial_wrapper:
            message = pb.Constructor(partial=self._partial(ctr, where))
        else:
            raise UnknownConstructor(_qualified_name(ctr), where)
        index = len(self._msg.constructors)
        self._msg.constructors.append(message)
        self._constructors[id(ctr)] = index
        return index

    def _partial(self, wrapper: Any, where: str) -> pb.PartialConstructor:
        """torchao's ``PartialWrapper(functools.partial(func, **keywords))``; its parts are
        added to the table first."""
        if id(wrapper) in self._in_progress:
            raise UnrepresentableMeta(f"{where}: a constructor that contains itself")
        extra = sorted(set(vars(wrapper)) - {"p", "callable_args", "__module__"})
        if extra:
            raise UnrepresentableMeta(
                f"{where}: the constructor's attribute(s) {', '.join(extra)} cannot be "
                "represented on the wire"
            )
        p = wrapper.p
        if type(p) is not functools.partial:
            raise UnrepresentableMeta(
                f"{where}: a PartialWrapper over a {_qualified_name(type(p))}, not a "
                "functools.partial"
            )
        if p.args:
            raise UnrepresentableMeta(
                f"{where}: a constructor with positional arguments ({len(p.args)})"
            )
        if type(wrapper.callable_args) is not dict:
            raise UnrepresentableMeta(f"{where}: callable_args is not a dict")
        module_attribute = vars(wrapper).get("__module__")
        if module_attribute is not None and type(module_attribute) is not str:
            raise UnrepresentableMeta(f"{where}: the constructor's __module__ is not a string")
        self._in_progress.add(id(wrapper))
        try:
            message = pb.PartialConstructor(
                func=self._constructor(p.func, where),
                keywords=[
                    self._keyword(name, value, f"{where} keyword {name!r}")
                    for name, value in p.keywords.items()
                ],
                callable_args=[
                    pb.Keyword(
                        name=name,
                        constructor=self._constructor(value, f"{where} callable_args[{name!r}]"),
                    )
                    for name, value in wrapper.callable_args.items()
                ],
                module_attribute=module_attribute,
            )
        finally:
            self._in_progress.discard(id(wrapper))
        return message

    def _keyword(self, name: str, value: Any, where: str) -> pb.Keyword:
        kind = type(value)
        if value is None:
            return pb.Keyword(name=name, none=True)
        if kind is bool:
            return pb.Keyword(name=name, bool_value=value)
        if kind is int:
            return pb.Keyword(name=name, int_value=_int(value, where))
        if kind is float:
            return pb.Keyword(name=name, double_value=value)
        if kind is str:
            return pb.Keyword(name=name, string_value=value)
        if kind is torch.dtype:
            return pb.Keyword(name=name, dtype=_dtype(value, where))
        if kind is torch.qscheme:
            return pb.Keyword(name=name, qscheme=_qscheme(value, where))
        if isinstance(value, type) or kind is self._partial_wrapper:
            return pb.Keyword(name=name, constructor=self._constructor(value, where))
        raise UnrepresentableMeta(
            f"{where}: a value of type {_qualified_name(kind)} cannot be represented on the wire"
        )


def _check_attributes(obj: Any, where: str) -> None:
    """Refuse an instance attribute that is not one of the dataclass's fields."""
    fields = {f.name for f in dataclasses.fields(obj)}
    extra = sorted(set(vars(obj)) - fields)
    if extra:
        raise UnrepresentableMeta(
            f"{where}: the attribute(s) {', '.join(extra)} of a {type(obj).__qualname__} "
            "cannot be represented on the wire"
        )


def _bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise UnrepresentableMeta(f"{where}: a {_qualified_name(type(value))}, not a bool")
    return value


def _int(value: Any, where: str) -> int:
    if type(value) is not int:
        raise UnrepresentableMeta(f"{where}: a {_qualified_name(type(value))}, not an int")
    if value not in _INT64:
        raise UnrepresentableMeta(f"{where}: integer {value} does not fit in 64 bits")
    return value


def _optional_int(value: Any, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _dtype(value: Any, where: str) -> str:
    name = str(value)
    if not isinstance(value, torch.dtype) or _DTYPES.get(name) is not value:
        raise UnrepresentableMeta(f"{where}: {value!r} is not a torch.dtype")
    return name


def _qscheme(value: Any, where: str) -> str:
    name = str(value)
    if not isinstance(value, torch.qscheme) or _QSCHEMES.get(name) is not value:
        raise UnrepresentableMeta(f"{where}: {value!r} is not a torch.qscheme")
    return name


def _optional_qscheme(value: Any, where: str) -> str | None:
    return None if value is None else _qscheme(value, where)


# --------------------------------------------------------------------------------------------
# Decoding


def apply_annotations(gm: torch.fx.GraphModule, msg: pb.Annotations) -> None:
    """Set ``node.meta["quantization_annotation"]`` on ``gm``'s nodes (by name) to objects
    rebuilt from ``msg``, with ``msg``'s sharing structure: one constructor object per
    ``constructors`` entry, one spec object per ``specs`` entry, one annotation object per
    ``NodeAnnotation.object`` index. Afterwards exactly the nodes ``msg`` names are annotated
    (an annotation ``gm`` held on another node is removed), so ``encode_annotations(gm)`` states
    ``msg`` again.

    Constructors and ``derive_qparams_fn`` are resolved through the allow-lists only
    (:class:`UnknownConstructor` naming one that is not on them). A node name not in
    ``gm.graph``, an index out of range (or, in ``constructors``, not earlier), a node named
    twice, entries of one ``object`` that differ, an unknown dtype or qscheme, or any other
    malformed entry raises :class:`ProgramDecodeError` naming it. Everything is rebuilt before
    anything is set: on an error ``gm`` is left as it was.
    """
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

    nodes: dict[str, torch.fx.Node] = {n.name: n for n in gm.graph.nodes}
    constructors: list[Any] = []
    for i, constructor in enumerate(msg.constructors):
        constructors.append(_decode_constructor(constructor, f"constructor {i}", constructors))
    specs = [
        _decode_spec(spec, f"spec {i}", constructors, nodes) for i, spec in enumerate(msg.specs)
    ]

    objects: dict[int, tuple[QuantizationAnnotation, pb.NodeAnnotation]] = {}
    assignments: dict[str, QuantizationAnnotation] = {}
    for entry in msg.nodes:
        where = f"annotation of node {entry.node!r}"
        node = nodes.get(entry.node)
        if node is None:
            raise ProgramDecodeError(f"{where}: no node of that name in the graph")
        if entry.node in assignments:
            raise ProgramDecodeError(f"{where}: the node is annotated twice")
        content = pb.NodeAnnotation()
        content.CopyFrom(entry)
        content.ClearField("node")
        if entry.object in objects:
            ann, first = objects[entry.object]
            if content != first:
                raise ProgramDecodeError(
                    f"{where}: object {entry.object} is stated differently by another node"
                )
        else:
            input_qspec_map: dict[torch.fx.Node, Any] = {}
            for item in entry.inputs:
                input_node = nodes.get(item.input)
                if input_node is None:
                    raise ProgramDecodeError(
                        f"{where}: input {item.input!r}: no node of that name in the graph"
                    )
                if input_node in input_qspec_map:
                    raise ProgramDecodeError(f"{where}: input {item.input!r} is named twice")
                input_qspec_map[input_node] = (
                    _index(specs, item.spec, f"{where}: input {item.input!r}: spec")
                    if item.HasField("spec")
                    else None
                )
            ann = QuantizationAnnotation(
                input_qspec_map=input_qspec_map,
                output_qspec=(
                    _index(specs, entry.output_spec, f"{where}: output_spec")
                    if entry.HasField("output_spec")
                    else None
                ),
                allow_implicit_sharing=entry.allow_implicit_sharing,
                _annotated=entry.annotated,
            )
            objects[entry.object] = (ann, content)
        assignments[entry.node] = ann

    for node in gm.graph.nodes:
        node.meta.pop(Q_ANNOTATION_KEY, None)
    for name, ann in assignments.items():
        nodes[name].meta[Q_ANNOTATION_KEY] = ann


def _index(table: list[Any], index: int, where: str) -> Any:
    if index >= len(table):
        raise ProgramDecodeError(f"{where}: index {index} out of range (0..{len(table) - 1})")
    return table[index]


def _decode_constructor(entry: pb.Constructor, where: str, earlier: list[Any]) -> Any:
    """One ``Constructor``; ``earlier`` holds the entries before it (the only ones it may
    name)."""
    kind = entry.WhichOneof("kind")
    if kind == "class_name":
        cls = ALLOWED_CONSTRUCTORS.get(entry.class_name)
        if cls is None:
            raise UnknownConstructor(entry.class_name, where)
        return cls
    if kind != "partial":
        raise ProgramDecodeError(f"{where}: neither class_name nor partial is set")
    from torchao.quantization.pt2e.observer import PartialWrapper

    partial = entry.partial
    func = _index(earlier, partial.func, f"{where}: func")
    keywords: dict[str, Any] = {}
    for keyword in partial.keywords:
        if keyword.name in keywords:
            raise ProgramDecodeError(f"{where}: keyword {keyword.name!r} is given twice")
        keywords[keyword.name] = _decode_keyword(
            keyword, f"{where}: keyword {keyword.name!r}", earlier
        )
    callable_args: dict[str, Any] = {}
    for keyword in partial.callable_args:
        kwhere = f"{where}: callable_args[{keyword.name!r}]"
        if keyword.name in callable_args:
            raise ProgramDecodeError(f"{kwhere}: given twice")
        if keyword.WhichOneof("value") != "constructor":
            raise ProgramDecodeError(f"{kwhere}: not a constructor")
        callable_args[keyword.name] = _index(earlier, keyword.constructor, kwhere)
    wrapper = PartialWrapper(functools.partial(func, **keywords))
    wrapper.callable_args = callable_args
    if partial.HasField("module_attribute"):
        # What FakeQuantizeBase.with_args does to the wrapper it returns.
        wrapper.__module__ = partial.module_attribute
    return wrapper


def _decode_keyword(keyword: pb.Keyword, where: str, earlier: list[Any]) -> Any:
    kind = keyword.WhichOneof("value")
    if kind == "none":
        return None
    if kind == "double_value":
        return keyword.double_value
    if kind == "int_value":
        return keyword.int_value
    if kind == "bool_value":
        return keyword.bool_value
    if kind == "string_value":
        return keyword.string_value
    if kind == "dtype":
        return _decode_dtype(keyword.dtype, where)
    if kind == "qscheme":
        return _decode_qscheme(keyword.qscheme, where)
    if kind == "constructor":
        return _index(earlier, keyword.constructor, where)
    raise ProgramDecodeError(f"{where}: no value is set")


def _decode_dtype(name: str, where: str) -> torch.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise ProgramDecodeError(f"{where}: unknown dtype {name!r}")
    return dtype


def _decode_qscheme(name: str, where: str) -> torch.qscheme:
    qscheme = _QSCHEMES.get(name)
    if qscheme is None:
        raise ProgramDecodeError(f"{where}: unknown qscheme {name!r}")
    return qscheme


def _decode_spec(
    entry: pb.QuantSpec, where: str, constructors: list[Any], nodes: Mapping[str, torch.fx.Node]
) -> Any:
    from torchao.quantization.pt2e import quantizer as q

    def optional_qscheme(message: Any) -> torch.qscheme | None:
        if not message.HasField("qscheme"):
            return None
        return _decode_qscheme(message.qscheme, f"{where}: qscheme")

    def optional(message: Any, field: str) -> int | None:
        return getattr(message, field) if message.HasField(field) else None

    kind = entry.WhichOneof("kind")
    try:
        if kind == "quantization":
            s = entry.quantization
            return q.QuantizationSpec(
                dtype=_decode_dtype(s.dtype, f"{where}: dtype"),
                observer_or_fake_quant_ctr=_index(
                    constructors, s.constructor, f"{where}: constructor"
                ),
                quant_min=optional(s, "quant_min"),
                quant_max=optional(s, "quant_max"),
                qscheme=optional_qscheme(s),
                ch_axis=optional(s, "ch_axis"),
                is_dynamic=s.is_dynamic,
            )
        if kind == "fixed":
            f = entry.fixed
            return q.FixedQParamsQuantizationSpec(
                dtype=_decode_dtype(f.dtype, f"{where}: dtype"),
                scale=f.scale,
                zero_point=f.zero_point,
                quant_min=optional(f, "quant_min"),
                quant_max=optional(f, "quant_max"),
                qscheme=optional_qscheme(f),
                is_dynamic=f.is_dynamic,
            )
        if kind == "shared":
            return q.SharedQuantizationSpec(
                _decode_edge_or_node(entry.shared.edge_or_node, f"{where}: edge_or_node", nodes)
            )
        if kind == "derived":
            d = entry.derived
            fn = ALLOWED_DERIVE_FUNCTIONS.get(d.derive_qparams_fn)
            if fn is None:
                raise UnknownConstructor(
                    d.derive_qparams_fn, f"{where}: derive_qparams_fn", derive_function=True
                )
            derived_from = [
                _decode_edge_or_node(v, f"{where}: derived_from[{i}]", nodes)
                for i, v in enumerate(d.derived_from)
            ]
            return q.DerivedQuantizationSpec(
                derived_from=tuple(derived_from) if d.derived_from_tuple else derived_from,
                derive_qparams_fn=fn,
                dtype=_decode_dtype(d.dtype, f"{where}: dtype"),
                quant_min=optional(d, "quant_min"),
                quant_max=optional(d, "quant_max"),
                qscheme=optional_qscheme(d),
                ch_axis=optional(d, "ch_axis"),
                is_dynamic=d.is_dynamic,
            )
    except ValueError as e:  # QuantizationSpec.__post_init__: quant_min > quant_max, ch_axis < 0
        raise ProgramDecodeError(f"{where}: {e}") from e
    raise ProgramDecodeError(f"{where}: no kind of spec is set")


def _decode_edge_or_node(
    entry: pb.EdgeOrNode, where: str, nodes: Mapping[str, torch.fx.Node]
) -> torch.fx.Node | tuple[torch.fx.Node, torch.fx.Node]:
    def node(name: str) -> torch.fx.Node:
        found = nodes.get(name)
        if found is None:
            raise ProgramDecodeError(f"{where}: no node named {name!r} in the graph")
        return found

    kind = entry.WhichOneof("kind")
    if kind == "node":
        return node(entry.node)
    if kind == "edge":
        return (node(entry.edge.input), node(entry.edge.user))
    raise ProgramDecodeError(f"{where}: neither node nor edge is set")
