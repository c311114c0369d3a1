"""The graph blob, written by the ecosystem's own serializers.

ATen programs are written by ``torch._export.serde`` (:func:`serialize_aten`), Edge programs by
``executorch.exir.serde`` (:func:`serialize_edge`), extended where it cannot go: lowered backend
modules and ``get_attr`` tensors are written as references (:data:`LOWERED_MARKER`,
:data:`GET_ATTR_MARKER`) that :mod:`~remote_partitioner.proto.codec.deserializers` reads back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.pytree_names import return_type_names
from remote_partitioner.proto.codec.shared_patch import SharedPatch
from remote_partitioner.proto.program_errors import CodecError, ProgramEncodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

if TYPE_CHECKING:
    from remote_partitioner.proto.codec.encode import Encoder

__all__ = ["GET_ATTR_MARKER", "LOWERED_MARKER", "serialize_aten", "serialize_edge"]

#: The key of the JSON object that stands for a lowered backend module (its path and name).
LOWERED_MARKER = "remote_partitioner.lowered_module"
#: The prefix of the string argument that stands for a ``get_attr`` node reading a tensor.
GET_ATTR_MARKER = "\x00remote_partitioner.get_attr\x00"


#: The metadata keys whose string values hold ``id()``s of the exporting process (graphs,
#: modules), renumbered by :class:`~.encode.Encoder` (``canonical_graph_ids``).
REWRITTEN_KEYS = frozenset({"from_node", "nn_module_stack"})

#: ``rewrite(key, value)``: the string to write for a string value under one of
#: :data:`REWRITTEN_KEYS`.
Rewrite = Callable[[str, str], str]


class DataclassToDict:
    """The serializers' ``_dataclass_to_dict``, faster and with the same result. torch's and
    exir's differ: exir's leaves out a field whose default is None while its value is None,
    and does not spell infinities and NaN as strings (``omit_none_defaults`` and
    ``spell_floats`` say which). Faster because each dataclass's fields are looked up once per
    class instead of once per object, and a union's value is read past exir's
    ``_Union.__getattribute__`` (which checks every attribute read and took most of an Edge
    program's encoding time). The union key is the same ``_UnionTag`` object the original puts
    there. ``tests/test_codec.py`` checks that every program encodes to the same bytes with
    the original functions."""

    def __init__(self, union: type, *, omit_none_defaults: bool, spell_floats: bool) -> None:
        self._union = union
        self._omit = omit_none_defaults
        self._spell = spell_floats
        # class -> (field name, its default is None) per dataclass field, or None for a union
        self._fields: dict[type, tuple[tuple[str, bool], ...] | None] = {}

    def __call__(self, obj: Any) -> Any:
        return self.convert(obj, None)

    def convert(self, obj: Any, rewrite: Rewrite | None) -> Any:
        """``obj`` as the original writes it; with ``rewrite``, each string value of a dict
        (a dataclass's too) whose key is in :data:`REWRITTEN_KEYS` is replaced by
        ``rewrite(key, value)``, in the order the result's dicts and lists are walked
        depth-first, values inside tuples excepted: what converting and then walking the
        result (``Encoder.canonical_graph_ids``) does, in one pass."""
        cls = type(obj)
        if cls is str or cls is int or cls is bool or obj is None:
            return obj
        if cls is list:
            return [self.convert(x, rewrite) for x in obj]
        if cls is dict:
            return self._entries(obj.items(), rewrite)
        if cls in self._fields:
            fields = self._fields[cls]
            if fields is None:
                # What the ``type`` property returns, read directly.
                tag = object.__getattribute__(obj, "_type")
                return self._entries(
                    ((tag, object.__getattribute__(obj, str(tag))),), rewrite
                )
            if self._omit:
                values = [(n, v) for n, none_default in fields
                          for v in (getattr(obj, n),) if not (none_default and v is None)]
                return self._entries(values, rewrite)
            return self._entries([(n, getattr(obj, n)) for n, _ in fields], rewrite)
        # The original's order of checks, for every other type.
        if isinstance(obj, self._union):
            self._fields[cls] = None
            return self.convert(obj, rewrite)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            self._fields[cls] = tuple(
                (f.name, f.default is None) for f in dataclasses.fields(obj)
            )
            return self.convert(obj, rewrite)
        if isinstance(obj, list):
            return [self.convert(x, rewrite) for x in obj]
        if isinstance(obj, tuple):
            # The walk the rewrite stands for does not enter tuples.
            return tuple(self.convert(x, None) for x in obj)
        if isinstance(obj, dict):
            return self._entries(obj.items(), rewrite)
        if self._spell and isinstance(obj, float):
            if obj == math.inf:
                return "Infinity"
            if obj == -math.inf:
                return "-Infinity"
            if math.isnan(obj):
                return "NaN"
        return obj

    def _entries(
        self, items: Iterable[tuple[Any, Any]], rewrite: Rewrite | None
    ) -> dict[Any, Any]:
        out = {}
        for k, v in items:
            value = self.convert(v, rewrite)
            if (
                rewrite is not None and type(value) is str and type(k) is str
                and k in REWRITTEN_KEYS
            ):
                value = rewrite(k, value)
            out[k] = value
        return out


def _union_classes() -> list[type]:
    from executorch.exir.serde.union import _Union as exir_union
    from torch._export.serde.union import _Union as torch_union

    return [torch_union, exir_union]


#: (union base class, its ``create`` and ``__post_init__`` before the block) while installed.
_replaced: list[tuple[type, Any, Any]] = []
#: union class -> every field of it set to None (the original computes it on each ``create``)
_none_fields: dict[type, dict[str, None]] = {}
#: union classes whose reserved-name check (``__post_init__``) has passed once
_checked: set[type] = set()


def _fast_create(create: Any, tag_cls: Any) -> Any:
    """``_Union.create`` with the all-None field arguments computed once per class."""

    def fast_create(cls: type, **kwargs: Any) -> Any:
        if len(kwargs) != 1:
            return create.__func__(cls, **kwargs)  # raises as the original does
        nones = _none_fields.get(cls)
        if nones is None:
            nones = _none_fields[cls] = {f.name: None for f in dataclasses.fields(cls)}
        obj = cls(**{**nones, **kwargs})
        obj._type = tag_cls.create(next(iter(kwargs.keys())), cls)
        return obj

    return classmethod(fast_create)


def _fast_post_init(post_init: Any) -> Any:
    """``_Union.__post_init__`` run once per class (its check reads the class's fields)."""

    def fast_post_init(self: Any) -> None:
        cls = type(self)
        if cls not in _checked:
            post_init(self)  # raises as the original does
            _checked.add(cls)

    return fast_post_init


def _install_fast_unions() -> None:
    import sys

    for union in _union_classes():
        create, post_init = union.__dict__["create"], union.__dict__["__post_init__"]
        tag_cls = sys.modules[union.__module__]._UnionTag
        union.create = _fast_create(create, tag_cls)  # type: ignore[attr-defined]
        union.__post_init__ = _fast_post_init(post_init)  # type: ignore[attr-defined]
        _replaced.append((union, create, post_init))


def _uninstall_fast_unions() -> None:
    for union, create, post_init in _replaced:
        union.create = create  # type: ignore[attr-defined]
        union.__post_init__ = post_init  # type: ignore[attr-defined]
    _replaced.clear()


_fast_unions = SharedPatch(_install_fast_unions, _uninstall_fast_unions)


def fast_unions() -> contextlib.AbstractContextManager[None]:
    """Within the block, the schema unions of torch's and exir's serializers (``_Union``)
    are built faster, the same objects: ``create`` computes a class's all-None field
    arguments once per class instead of calling ``dataclasses.fields`` on every value, and
    ``__post_init__`` checks a class's field names for reserved ones once per class (they
    depend on the class only). That was a fifth of a program's encoding time; the graph JSON
    is the same (``tests/test_codec.py`` compares it with the originals'). Visible to every
    thread while any block runs (:class:`~.shared_patch.SharedPatch`)."""
    return _fast_unions()


_to_dict: dict[str, DataclassToDict] = {}


def dataclass_to_dict(dialect: str) -> DataclassToDict:
    """The fast ``_dataclass_to_dict`` of torch's (``"aten"``) or exir's (``"edge"``) schema."""
    converter = _to_dict.get(dialect)
    if converter is None:
        if dialect == "aten":
            from torch._export.serde.union import _Union as union

            converter = DataclassToDict(union, omit_none_defaults=False, spell_floats=True)
        else:
            from executorch.exir.serde.union import _Union as union  # type: ignore[no-redef]

            converter = DataclassToDict(union, omit_none_defaults=True, spell_floats=False)
        _to_dict[dialect] = converter
    return converter


def serialize_aten(ep: ExportedProgram, encoder: Encoder) -> bytes:
    """The export schema's JSON for ``ep``'s graph, as ``torch._export.serde.serialize`` writes
    it with no state dict, constants or example inputs.

    This is ``ExportedProgramSerializer.serialize`` without two steps whose results it throws
    away: the ``canonicalize`` self-check (a deep copy of the whole schema object, half the
    time) and pickling. The bytes are the same but for the process-local ids that
    :meth:`.encode.Encoder.canonical_graph_ids` renumbers (``tests/test_codec.py`` compares them).
    """
    from torch._export.non_strict_utils import _enable_graph_inputs_of_type_nn_module
    from torch._export.serde import schema
    from torch._export.serde import serialize as tser

    try:
        with _enable_graph_inputs_of_type_nn_module(ep.example_inputs), return_type_names():
            ep.validate()
            module = tser.GraphModuleSerializer(
                ep.graph_signature, ep.module_call_graph
            ).serialize(ep.graph_module)
            serialized = schema.ExportedProgram(
                graph_module=module,
                opset_version={"aten": torch._C._get_max_operator_version()},
                range_constraints=tser.serialize_range_constraints(ep.range_constraints),
                schema_version=schema.SchemaVersion(
                    major=tser.SCHEMA_VERSION[0], minor=tser.SCHEMA_VERSION[1]
                ),
                verifiers=[v.dialect for v in ep.verifiers],
                torch_version=torch.__version__,
                guards_code=ep._guards_code,
            )
            return encoder.schema_json(
                serialized, dataclass_to_dict("aten"), tser.EnumEncoder, allow_nan=False
            )
    except Exception as e:
        raise ProgramEncodeError(f"torch's serializer failed: {type(e).__name__}: {e}") from e


def edge_metadata_serializer_class() -> type:
    """exir's ``GraphModuleSerializer`` that also writes ``node.meta["custom"]``, as torch's
    own serializer does (``json.dumps``); exir's copy of torch's serializer drops it.

    Backends keep their own facts there through export: Arm's quantizer marks each quantized
    node (``custom["_arm_annotation_info"]``) and Arm's partitioner reads the mark, so without
    it a quantized program is partitioned as a float one on the server.
    """
    from executorch.exir.serde import serialize as eser

    class MetadataSerializer(eser.GraphModuleSerializer):  # type: ignore[misc,valid-type]
        def serialize_metadata(self, node: torch.fx.Node) -> dict[str, str]:
            meta: dict[str, str] = super().serialize_metadata(node)
            custom = node.meta.get("custom")
            if custom:
                try:
                    meta["custom"] = json.dumps(custom)
                except (TypeError, ValueError) as e:
                    raise ProgramEncodeError(
                        f"node {node.name!r}: meta 'custom' is not JSON data: {e}"
                    ) from e
            return meta

    return MetadataSerializer


def edge_metadata_deserializer_class() -> type:
    """exir's ``GraphModuleDeserializer`` that also reads ``custom`` (``json.loads``: data
    only), the counterpart of :func:`edge_metadata_serializer_class`."""
    from executorch.exir.serde import serialize as eser

    class MetadataDeserializer(eser.GraphModuleDeserializer):  # type: ignore[misc,valid-type]
        def deserialize_metadata(self, metadata: dict[str, str]) -> dict[str, Any]:
            res: dict[str, Any] = super().deserialize_metadata(metadata)
            custom = metadata.get("custom")
            if custom:
                res["custom"] = json.loads(custom)
            return res

    return MetadataDeserializer


def _edge_serializer_class() -> type:
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.serde import export_serialize, schema

    class Serializer(edge_metadata_serializer_class()):  # type: ignore[misc]
        """exir's serializer, with lowered modules and get_attr tensors sent by reference,
        and ``custom`` metadata."""

        encoder: Encoder
        lowered: list[pb.LoweredModule]
        module_tensors: list[pb.ModuleTensor]
        paths: dict[int, str]

        def _path_of(self, node: torch.fx.Node) -> str:
            return self.paths.get(id(node.graph.owning_module), "")

        def serialize_lowered_module(self, lowered_module_arg: torch.fx.Node) -> str:
            owner = lowered_module_arg.graph.owning_module
            module = getattr(owner, str(lowered_module_arg.target))
            if not isinstance(module, LoweredBackendModule):
                raise ProgramEncodeError(
                    f"{lowered_module_arg.target!r} is not a lowered backend module"
                )
            path = self._path_of(lowered_module_arg)
            entry = pb.LoweredModule(
                module_path=path,
                name=str(lowered_module_arg.target),
                backend_id=module.backend_id,
                compile_specs=[
                    pb.CompileSpec(key=cs.key, value=bytes(cs.value))
                    for cs in module.compile_specs
                ],
            )
            if self.encoder.withhold_lowered:
                entry.original_withheld = True
            else:
                entry.original_program.CopyFrom(self.encoder.program(module.original_module))
            self.lowered.append(entry)
            return json.dumps(
                {LOWERED_MARKER: {"path": path, "name": str(lowered_module_arg.target)}}
            )

        def serialize_input(self, arg: Any, arg_type: Any = None) -> Any:
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                attr = getattr(arg.graph.owning_module, str(arg.target))
                if isinstance(attr, torch.Tensor):
                    path = self._path_of(arg)
                    self.module_tensors.append(
                        pb.ModuleTensor(
                            module_path=path, tensor=self.encoder.tensor(str(arg.target), attr)
                        )
                    )
                    text = json.dumps({"name": arg.name, "target": str(arg.target)})
                    return schema.Argument.create(as_string=GET_ATTR_MARKER + text)
            return super().serialize_input(arg, arg_type)

    del export_serialize
    return Serializer


def serialize_edge(
    ep: ExportedProgram,
    encoder: Encoder,
    lowered: list[pb.LoweredModule],
    module_tensors: list[pb.ModuleTensor],
    paths: dict[int, str],
) -> bytes:
    """The export schema's JSON for Edge program ``ep``, written by ExecuTorch's serializer,
    with each lowered module appended to ``lowered`` (its original program encoded by
    ``encoder``) and each tensor a ``get_attr`` node reads appended to ``module_tensors``;
    ``paths`` maps ``id()`` of each graph module to its path.

    Raises:
        ProgramEncodeError: the serializer failed, or the program holds custom objects.
    """
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde.schema import SCHEMA_VERSION

    serializer = _edge_serializer_class()(ep.graph_signature, ep.module_call_graph)
    serializer.encoder = encoder
    serializer.lowered = lowered
    serializer.module_tensors = module_tensors
    serializer.paths = paths
    try:
        with return_type_names():
            graph_module = serializer.serialize(ep.graph_module)
        serialized = schema.ExportedProgram(
            graph_module=graph_module,
            opset_version={"aten": torch._C._get_max_operator_version()},
            range_constraints=export_serialize.serialize_range_constraints(
                ep.range_constraints
            ),
            schema_version=schema.SchemaVersion(major=SCHEMA_VERSION[0], minor=SCHEMA_VERSION[1]),
            verifiers=[v.dialect for v in ep.verifiers],
        )
    except CodecError:
        raise
    except Exception as e:
        raise ProgramEncodeError(
            f"ExecuTorch's serializer failed: {type(e).__name__}: {e}"
        ) from e
    if serializer.custom_objs:
        raise ProgramEncodeError(
            f"custom objects {sorted(serializer.custom_objs)} cannot cross the wire"
        )
    return encoder.schema_json(
        serialized, dataclass_to_dict("edge"), export_serialize.EnumEncoder, allow_nan=True,
    )
