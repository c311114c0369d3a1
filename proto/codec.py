"""The program codec: ``torch.export.ExportedProgram`` <-> ``remote_partitioner.v1.Program``.

The graph crosses as the export schema's JSON, written and read by the serializers torch and
ExecuTorch ship (``torch._export.serde`` for ATen programs, ``executorch.exir.serde`` for Edge
programs). Tensors cross as raw storage bytes in content-addressed blobs, with dtype, sizes,
strides and storage offset inline; a ``FakeTensor`` crosses as metadata only. Nothing is pickled.

What the serializers get wrong is repaired here, in one place:

* ``exir.serde`` does not record whether an argument was passed by position or by keyword
  (``aten.linear(x, w, b)`` comes back as ``linear(x, w, bias=b)``): the client's fingerprint
  records it, and the decoder restores it.
* ``exir.serde`` adds unused ``getitem`` nodes for multi-output operators: the decoder removes
  the unused ``getitem`` nodes the client's graph does not have.
* ``exir.serde`` refuses ``get_attr`` nodes that read tensors (a ``torch.cond`` branch reading a
  constant): such tensors cross as ``ModuleTensor`` and their nodes are rebuilt.
* Lowered backend modules cross as ``LoweredModule`` (backend id, compile specs, original
  program), never as the pickles ``exir.serde`` would embed.
* ``get_attr`` nodes come back where the deserializer first needs them: the decoder moves them
  back to the client's position.

* The graph JSON holds no metadata for placeholder, get_attr, output and getitem nodes, and
  never ``tensor_meta``: ``NodeMetadata`` carries the serializer's own metadata strings for
  those nodes and the shape of ``tensor_meta``, which is rebuilt from ``val``.

After decoding, the rebuilt program's fingerprint is compared with the client's; any difference
raises :class:`FingerprintMismatch` naming the first differing node.

Node metadata that crosses: ``val``, ``tensor_meta``, ``stack_trace``, ``nn_module_stack``,
``source_fn_stack``, ``torch_fn``, ``debug_handle``, ``from_node`` (Edge), ``custom``. Not
crossing, and read by no hosted partitioner: ``seq_nr``, ``example_value``, ``original_aten``,
``desc``.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import math
import operator
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.graph_check import check_target, checked_graph_json
from remote_partitioner.proto.program_errors import (
    BlobMissing,
    BlobSizeMismatch,
    CodecError,
    FingerprintMismatch,
    ProgramDecodeError,
    ProgramEncodeError,
    UnrepresentableMeta,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = [
    "BlobMissing",
    "BlobSizeMismatch",
    "CodecError",
    "EncodedProgram",
    "FingerprintMismatch",
    "ProgramDecodeError",
    "ProgramEncodeError",
    "UnrepresentableMeta",
    "check_target",
    "checked_graph_json",
    "decode_meta_value",
    "decode_program",
    "digest_of",
    "encode_meta_value",
    "encode_program",
    "fingerprint",
    "first_difference",
    "graph_digests",
    "graph_modules",
    "iter_digests",
    "op_from_name",
    "op_name",
    "target_name",
]

_LOWERED_MARKER = "remote_partitioner.lowered_module"
_GET_ATTR_MARKER = "\x00remote_partitioner.get_attr\x00"



# --------------------------------------------------------------------------------------------
# Digests and blobs


def _storage_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy view of the bytes of ``t``'s whole untyped storage."""
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return memoryview(b"")
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[call-overload]
    # Read-only: a program decoded from these views copies them instead of sharing memory
    # with the tensors they were taken from.
    return memoryview(flat.numpy()).cast("B").toreadonly()  # type: ignore[arg-type]


@dataclasses.dataclass
class EncodedProgram:
    """A program message and the blobs it refers to (digest hash -> bytes)."""

    message: pb.Program
    blobs: dict[str, memoryview | bytes]

    def digests(self) -> list[pb.Digest]:
        """Every blob digest the message refers to, once each."""
        return [pb.Digest(hash=h, size_bytes=memoryview(b).nbytes) for h, b in self.blobs.items()]


class DigestCache:
    """Remembers the digest of each tensor storage while it is alive and unchanged.

    Keyed by the storage's data pointer and size and the tensor's version counter, and checked
    against a weak reference to the storage, so a freed or mutated storage is hashed again.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], tuple[Any, int, pb.Digest]] = {}

    def storage_digest(self, t: torch.Tensor, data: memoryview) -> pb.Digest:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        version = t._version
        hit = self._entries.get(key)
        if hit is not None and hit[1] == version and hit[0]() is not None:
            return hit[2]
        digest = digest_of(data)
        try:
            import weakref

            ref: Any = weakref.ref(storage)
        except TypeError:
            return digest
        self._entries[key] = (ref, version, digest)
        return digest


# --------------------------------------------------------------------------------------------
# Graph walking and fingerprints


def graph_modules(gm: torch.fx.GraphModule) -> list[tuple[str, torch.fx.GraphModule]]:
    """Every graph module of a program's module tree, root first, as (path, module).

    The path is "" for the root and the dotted attribute path for a submodule (e.g. the
    branches of ``torch.cond``). Modules that are not graph modules (lowered backend modules)
    are not entered.
    """
    out: list[tuple[str, torch.fx.GraphModule]] = []

    def walk(prefix: str, mod: torch.fx.GraphModule) -> None:
        out.append((prefix, mod))
        for name, child in mod.named_children():
            if isinstance(child, torch.fx.GraphModule):
                walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", gm)
    return out


def target_name(target: Any) -> str:
    """A node target's qualified name, as the fingerprint records it."""
    if isinstance(target, str):
        return target
    op = getattr(target, "_op", None)  # EdgeOpOverload wraps an OpOverload
    if isinstance(op, torch._ops.OpOverload) and type(target).__name__ == "EdgeOpOverload":
        return f"edge.{op}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"hop.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return type(target).__qualname__
    return f"{module}.{name}" if module else str(name)


def _arg_text(a: Any) -> str:
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, tuple):
        return "(" + ", ".join(_arg_text(x) for x in a) + ",)"
    if isinstance(a, list):
        return "[" + ", ".join(_arg_text(x) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_arg_text(v)}" for k, v in a.items()) + "}"
    if isinstance(a, float):
        return repr(a) if math.isfinite(a) else str(a)
    if a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device, torch.layout)):
        return repr(a)
    if isinstance(a, torch.memory_format):
        return str(a)
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym:{a}"
    return f"<{type(a).__name__}>"


def _args_text(node: torch.fx.Node) -> str:
    return _arg_text(node.args) + _arg_text(dict(node.kwargs))


def fingerprint(ep: ExportedProgram) -> list[pb.NodeFingerprint]:
    """The structural fingerprint of every node of every graph of ``ep``, in graph order."""
    out = []
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            out.append(
                pb.NodeFingerprint(
                    graph=path,
                    name=node.name,
                    op=node.op,
                    target=target_name(node.target),
                    num_args=len(node.args),
                    kwarg_names=list(node.kwargs.keys()),
                    args=_args_text(node),
                )
            )
    return out


def first_difference(
    expected: Iterable[pb.NodeFingerprint], actual: Iterable[pb.NodeFingerprint]
) -> str | None:
    """A message naming the first node where two fingerprints differ, or None if equal."""
    exp, act = list(expected), list(actual)
    fields = ("graph", "name", "op", "target", "num_args", "kwarg_names", "args")
    for i, (e, a) in enumerate(zip(exp, act, strict=False)):
        for f in fields:
            ev, av = getattr(e, f), getattr(a, f)
            if f == "kwarg_names":
                ev, av = list(ev), list(av)
            if ev != av:
                where = f"graph {e.graph or '<root>'!r}, node #{i} {e.name!r}"
                return f"{where}: {f} differs: client has {ev!r}, server rebuilt {av!r}"
    if len(exp) != len(act):
        longer, side = (exp, "client") if len(exp) > len(act) else (act, "server")
        extra = longer[min(len(exp), len(act))]
        return (
            f"node counts differ: client has {len(exp)}, server rebuilt {len(act)}; first extra "
            f"node on the {side}: graph {extra.graph or '<root>'!r}, node {extra.name!r}"
        )
    return None


# --------------------------------------------------------------------------------------------
# Operators by name


def op_name(op: Any) -> str:
    """``aten.linear.default`` -> ``"aten::linear.default"``."""
    if not isinstance(op, torch._ops.OpOverload):
        raise ProgramEncodeError(f"not an operator overload: {op!r} ({type(op).__name__})")
    return f"{op.namespace}::{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


def op_from_name(name: str) -> torch._ops.OpOverload:
    """The registered ``OpOverload`` named ``"namespace::name.overload"``; ValueError if none."""
    try:
        namespace, rest = name.split("::", 1)
        opname, overload = rest.rsplit(".", 1)
    except ValueError:
        raise ValueError(f"malformed operator name {name!r}") from None
    for part in (namespace, opname, overload):
        if not part.isidentifier() or part.startswith("_" * 2):
            raise ValueError(f"malformed operator name {name!r}")
    try:
        packet = getattr(getattr(torch.ops, namespace), opname)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise ValueError(f"no registered operator {name!r}") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise ValueError(f"no registered operator {name!r}")
    return op


# --------------------------------------------------------------------------------------------
# Node metadata values


def encode_meta_value(value: Any, *, where: str = "") -> pb.MetaValue:
    """Plain data -> MetaValue; :class:`UnrepresentableMeta` naming ``where`` otherwise."""
    if value is None:
        return pb.MetaValue(none_value=True)
    if isinstance(value, bool):
        return pb.MetaValue(bool_value=value)
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise UnrepresentableMeta(f"{where}: integer {value} does not fit in 64 bits")
        return pb.MetaValue(int_value=value)
    if isinstance(value, float):
        return pb.MetaValue(double_value=value)
    if isinstance(value, str):
        return pb.MetaValue(string_value=value)
    if isinstance(value, (bytes, bytearray)):
        return pb.MetaValue(bytes_value=bytes(value))
    if isinstance(value, list):
        return pb.MetaValue(
            list_value=pb.MetaList(items=[encode_meta_value(v, where=where) for v in value])
        )
    if isinstance(value, tuple) and type(value) is tuple:
        return pb.MetaValue(
            tuple_value=pb.MetaList(items=[encode_meta_value(v, where=where) for v in value])
        )
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return pb.MetaValue(
            map_value=pb.MetaMap(
                entries={k: encode_meta_value(v, where=where) for k, v in value.items()}
            )
        )
    raise UnrepresentableMeta(
        f"{where}: a value of type {type(value).__module__}.{type(value).__qualname__} "
        "cannot be represented on the wire"
    )


def decode_meta_value(value: pb.MetaValue) -> Any:
    """MetaValue -> plain Python data (the inverse of :func:`encode_meta_value`)."""
    kind = value.WhichOneof("value")
    if kind is None or kind == "none_value":
        return None
    if kind == "list_value":
        return [decode_meta_value(v) for v in value.list_value.items]
    if kind == "tuple_value":
        return tuple(decode_meta_value(v) for v in value.tuple_value.items)
    if kind == "map_value":
        return {k: decode_meta_value(v) for k, v in value.map_value.entries.items()}
    return getattr(value, kind)


# --------------------------------------------------------------------------------------------
# Encoding


def _dialect_of(ep: ExportedProgram) -> pb.Dialect:
    dialects = {v.dialect for v in ep.verifiers}
    if "EDGE" in dialects:
        return pb.DIALECT_EDGE
    return pb.DIALECT_ATEN


#: Metadata strings holding ``id()``s of the exporting process, and how each is made canonical.
_PROCESS_IDS = {
    "from_node": "_canonical_from_node",
    "nn_module_stack": "_canonical_module_stack",
}


class _Encoder:
    def __init__(self, digests: DigestCache | None) -> None:
        self.blobs: dict[str, memoryview | bytes] = {}
        self.digests = digests or DigestCache()
        # storage key -> digest, for this encoding
        self._storages: dict[tuple[int, int], pb.Digest] = {}
        # ``from_node`` graph ids (addresses of this process's graphs) -> 0, 1, 2, ...
        self._graph_ids: dict[int, int] = {}
        # numeric ``nn_module_stack`` keys (addresses of this process's modules) -> 0, 1, ...
        self._module_ids: dict[str, str] = {}

    def graph_json(
        self, tree: Any, encoder_cls: type[json.JSONEncoder], *, allow_nan: bool
    ) -> bytes:
        """The schema object's dict ``tree`` as JSON bytes (written as its serializer writes
        it), with process-local ids made canonical."""
        return json.dumps(
            self.canonical_graph_ids(tree), cls=encoder_cls, allow_nan=allow_nan
        ).encode("utf-8")

    def canonical_graph_ids(self, tree: Any) -> Any:
        """``tree`` with the graph ids of every ``from_node`` string, and the numeric keys of
        every ``nn_module_stack`` string, renumbered 0, 1, 2, ... in order of first appearance
        in this encoding.

        Both are ``id()``s of objects of the exporting process (graphs, modules): memory
        addresses that change from run to run and mean nothing elsewhere. Only which nodes
        share one is read (ExecuTorch's debug handles group nodes by graph id), and renumbering
        keeps that, while the same program now encodes to the same bytes in every process, so
        that its blobs and cached results are found again.
        """
        if isinstance(tree, dict):
            for k, v in tree.items():
                if type(k) is str and type(v) is str and k in _PROCESS_IDS:
                    tree[k] = getattr(self, _PROCESS_IDS[k])(v)
                elif isinstance(v, (dict, list)):
                    self.canonical_graph_ids(v)
        elif isinstance(tree, list):
            for v in tree:
                if isinstance(v, (dict, list)):
                    self.canonical_graph_ids(v)
        return tree

    def _canonical_from_node(self, text: str) -> str:
        try:
            sources = json.loads(text)
        except ValueError:
            return text

        def walk(value: Any) -> None:
            if isinstance(value, list):
                for v in value:
                    walk(v)
            elif isinstance(value, dict):
                gid = value.get("graph_id")
                if isinstance(gid, int):
                    value["graph_id"] = self._graph_ids.setdefault(gid, len(self._graph_ids))
                walk(value.get("from_node"))

        walk(sources)
        return json.dumps(sources)

    def _canonical_module_stack(self, text: str) -> str:
        # "key,path,type;key,path,type": a strict export's keys are module addresses.
        items = []
        for item in text.split(";"):
            key, sep, rest = item.partition(",")
            if sep and key.isdigit():
                key = self._module_ids.setdefault(key, str(len(self._module_ids)))
            items.append(key + sep + rest)
        return ";".join(items)

    def blob(self, data: memoryview | bytes) -> pb.Digest:
        d = digest_of(data)
        self.blobs.setdefault(d.hash, data)
        return d

    def tensor(self, name: str, t: torch.Tensor) -> pb.TensorRef:
        if not isinstance(t, torch.Tensor):
            raise ProgramEncodeError(
                f"{name!r} is a {type(t).__qualname__}, not a tensor; custom objects cannot "
                "cross the wire"
            )
        ref = pb.TensorRef(
            name=name,
            dtype=str(t.dtype).removeprefix("torch."),
            sizes=[int(s) for s in t.shape],
            strides=[int(s) for s in t.stride()],
            storage_offset=int(t.storage_offset()),
            is_parameter=isinstance(t, torch.nn.Parameter),
            requires_grad=bool(t.requires_grad),
        )
        if isinstance(t, torch._subclasses.fake_tensor.FakeTensor):
            ref.fake = True
            return ref
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
            raise ProgramEncodeError(
                f"tensor {name!r} ({t.device}, {t.layout}, {t.dtype}) cannot cross the wire: "
                "only dense CPU tensors can"
            )
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        digest = self._storages.get(key)
        if digest is None:
            data = _storage_bytes(t)
            digest = self.digests.storage_digest(t, data)
            self._storages[key] = digest
            self.blobs.setdefault(digest.hash, data)
        ref.storage.CopyFrom(digest)
        return ref

    def program(self, ep: ExportedProgram) -> pb.Program:
        dialect = _dialect_of(ep)
        lowered: list[pb.LoweredModule] = []
        module_tensors: list[pb.ModuleTensor] = []
        paths = {id(m): p for p, m in graph_modules(ep.graph_module)}
        if dialect == pb.DIALECT_EDGE:
            graph_json = _serialize_edge(ep, self, lowered, module_tensors, paths)
        else:
            graph_json = _serialize_aten(ep, self)
        msg = pb.Program(dialect=dialect)
        msg.graph.CopyFrom(self.blob(graph_json))
        msg.state_dict.extend(self.tensor(k, v) for k, v in ep.state_dict.items())
        msg.constants.extend(self.tensor(k, v) for k, v in ep.constants.items())
        msg.module_tensors.extend(module_tensors)
        msg.lowered_modules.extend(lowered)
        msg.fingerprint.extend(fingerprint(ep))
        msg.node_metadata.extend(_node_metadata(ep, dialect, self))
        return msg


def _metadata_serializer(ep: ExportedProgram, dialect: pb.Dialect) -> Any:
    if dialect == pb.DIALECT_EDGE:
        from executorch.exir.serde import serialize as eser

        return eser.GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)
    from torch._export.serde import serialize as tser

    return tser.GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)


def _node_metadata(
    ep: ExportedProgram, dialect: pb.Dialect, encoder: _Encoder
) -> Iterator[pb.NodeMetadata]:
    """What the graph JSON drops: the metadata of nodes it holds no metadata for (placeholder,
    get_attr, output and getitem nodes), the presence and shape of ``tensor_meta``, and a
    ``val`` that is a list."""
    serializer = _metadata_serializer(ep, dialect)
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            entries: dict[str, str] = {}
            if node.op != "call_function" or node.target is operator.getitem:
                try:
                    entries = encoder.canonical_graph_ids(serializer.serialize_metadata(node))
                except Exception as e:
                    raise ProgramEncodeError(
                        f"metadata of placeholder {node.name!r} cannot be serialized: {e}"
                    ) from e
            tensor_meta = node.meta.get("tensor_meta")
            has_tensor_meta = "tensor_meta" in node.meta
            no_val = "val" not in node.meta
            val_is_list = isinstance(node.meta.get("val"), list)
            if entries or has_tensor_meta or no_val or val_is_list:
                yield pb.NodeMetadata(
                    node=pb.NodeRef(graph=path, name=node.name),
                    entries=entries,
                    has_tensor_meta=has_tensor_meta,
                    tensor_meta_requires_grad=bool(getattr(tensor_meta, "requires_grad", False)),
                    no_val=no_val,
                    val_is_list=val_is_list,
                    tensor_meta_is_none=has_tensor_meta and tensor_meta is None,
                    tensor_meta_none_items=[t is None for t in tensor_meta]
                    if isinstance(tensor_meta, (list, tuple))
                    else [],
                )


def _serialize_aten(ep: ExportedProgram, encoder: _Encoder) -> bytes:
    """The export schema's JSON for ``ep``'s graph, as ``torch._export.serde.serialize`` writes
    it with no state dict, constants or example inputs.

    This is ``ExportedProgramSerializer.serialize`` without two steps whose results it throws
    away: the ``canonicalize`` self-check (a deep copy of the whole schema object, half the
    time) and pickling. The bytes are the same but for the process-local ids that
    :meth:`_Encoder.canonical_graph_ids` renumbers (``tests/test_codec.py`` compares them).
    """
    from torch._export.non_strict_utils import _enable_graph_inputs_of_type_nn_module
    from torch._export.serde import schema
    from torch._export.serde import serialize as tser

    try:
        with _enable_graph_inputs_of_type_nn_module(ep.example_inputs):
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
            return encoder.graph_json(
                tser._dataclass_to_dict(serialized), tser.EnumEncoder, allow_nan=False
            )
    except Exception as e:
        raise ProgramEncodeError(f"torch's serializer failed: {type(e).__name__}: {e}") from e


def _edge_serializer_class() -> type:
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde import serialize as eser

    class Serializer(eser.GraphModuleSerializer):  # type: ignore[misc,valid-type]
        """exir's serializer, with lowered modules and get_attr tensors sent by reference."""

        encoder: _Encoder
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
            self.lowered.append(
                pb.LoweredModule(
                    module_path=path,
                    name=str(lowered_module_arg.target),
                    backend_id=module.backend_id,
                    compile_specs=[
                        pb.CompileSpec(key=cs.key, value=bytes(cs.value))
                        for cs in module.compile_specs
                    ],
                    original_program=self.encoder.program(module.original_module),
                )
            )
            return json.dumps(
                {_LOWERED_MARKER: {"path": path, "name": str(lowered_module_arg.target)}}
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
                    return schema.Argument.create(as_string=_GET_ATTR_MARKER + text)
            return super().serialize_input(arg, arg_type)

    del export_serialize
    return Serializer


def _serialize_edge(
    ep: ExportedProgram,
    encoder: _Encoder,
    lowered: list[pb.LoweredModule],
    module_tensors: list[pb.ModuleTensor],
    paths: dict[int, str],
) -> bytes:
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde.schema import SCHEMA_VERSION

    serializer = _edge_serializer_class()(ep.graph_signature, ep.module_call_graph)
    serializer.encoder = encoder
    serializer.lowered = lowered
    serializer.module_tensors = module_tensors
    serializer.paths = paths
    try:
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
    return encoder.graph_json(
        export_serialize._dataclass_to_dict(serialized), export_serialize.EnumEncoder,
        allow_nan=True,
    )


def encode_program(ep: ExportedProgram, *, digests: DigestCache | None = None) -> EncodedProgram:
    """Encode ``ep`` as a Program message and the blobs it names.

    Args:
        ep: An ATen or Edge program. Its state_dict may hold ``FakeTensor``s (they cross as
            metadata only); its constants and other tensors must be dense CPU tensors.
        digests: A cache of storage digests, so that a storage is hashed once per lowering.

    Raises:
        ProgramEncodeError: the program holds something that cannot cross (custom objects,
            non-CPU tensors, a node the serializer refuses).
    """
    encoder = _Encoder(digests)
    message = encoder.program(ep)
    return EncodedProgram(message=message, blobs=encoder.blobs)


# --------------------------------------------------------------------------------------------
# Decoding


_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype)
}


class _Decoder:
    def __init__(self, blobs: Callable[[pb.Digest], bytes | bytearray | memoryview]) -> None:
        self._get_blob = blobs
        self._storages: dict[str, torch.UntypedStorage] = {}
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = {}

    def blob(self, digest: pb.Digest) -> bytes | bytearray | memoryview:
        data = self._get_blob(digest)
        if memoryview(data).nbytes != digest.size_bytes:
            raise BlobSizeMismatch(
                f"blob {digest.hash} holds {memoryview(data).nbytes} bytes, "
                f"the program declares {digest.size_bytes}"
            )
        return data

    def storage(self, digest: pb.Digest) -> torch.UntypedStorage:
        s = self._storages.get(digest.hash)
        if s is None:
            view = memoryview(self.blob(digest)).cast("B")
            if view.nbytes == 0:
                s = torch.UntypedStorage(0)
            else:
                # A writable buffer is shared (zero-copy); a read-only one is copied, since
                # tensors are writable.
                buf = bytearray(view) if view.readonly else view
                s = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
            self._storages[digest.hash] = s
        return s

    def tensor(self, ref: pb.TensorRef, fake_mode: Any = None) -> torch.Tensor:
        dtype = _DTYPES.get(ref.dtype)
        if dtype is None:
            raise ProgramDecodeError(f"tensor {ref.name!r}: unknown dtype {ref.dtype!r}")
        sizes, strides = list(ref.sizes), list(ref.strides)
        if len(sizes) != len(strides) or any(s < 0 for s in sizes) or ref.storage_offset < 0:
            raise ProgramDecodeError(f"tensor {ref.name!r}: malformed sizes or strides")
        key = (ref.storage.hash, ref.dtype, tuple(sizes), tuple(strides), ref.storage_offset,
               ref.fake, ref.is_parameter, ref.requires_grad)
        if not ref.fake and key in self._tensors:
            return self._tensors[key]
        if ref.fake:
            if fake_mode is None:
                raise ProgramDecodeError(
                    f"tensor {ref.name!r} is fake but the graph has no fake mode"
                )
            with fake_mode:
                t = torch.empty_strided(sizes, strides, dtype=dtype, device="cpu")
        else:
            if not ref.HasField("storage"):
                raise ProgramDecodeError(f"tensor {ref.name!r} has no storage")
            storage = self.storage(ref.storage)
            numel = math.prod(sizes)
            itemsize = torch.empty((), dtype=dtype).element_size()
            if numel:
                last = ref.storage_offset + sum(
                    (s - 1) * st for s, st in zip(sizes, strides, strict=True)
                )
                if any(st < 0 for st in strides) or (last + 1) * itemsize > storage.nbytes():
                    raise ProgramDecodeError(
                        f"tensor {ref.name!r} reaches beyond its storage of "
                        f"{storage.nbytes()} bytes"
                    )
            t = torch.empty(0, dtype=dtype).set_(storage, ref.storage_offset, sizes, strides)  # type: ignore[call-overload]
        if ref.is_parameter:
            t = torch.nn.Parameter(t, requires_grad=ref.requires_grad)
        elif ref.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        if not ref.fake:
            self._tensors[key] = t
        return t

    def program(self, msg: pb.Program) -> ExportedProgram:
        from torch._guards import detect_fake_mode

        if msg.dialect not in (pb.DIALECT_ATEN, pb.DIALECT_EDGE):
            raise ProgramDecodeError("the program's dialect is not set")
        if not msg.HasField("graph"):
            raise ProgramDecodeError("the program has no graph")
        raw = bytes(self.blob(msg.graph))
        real_state = {r.name: self.tensor(r) for r in msg.state_dict if not r.fake}
        constants = {r.name: self.tensor(r) for r in msg.constants}
        fakes = [r for r in msg.state_dict if r.fake]
        # Placeholders for fake parameters until the graph's fake mode is known.
        state_dict: dict[str, torch.Tensor] = {}
        for r in msg.state_dict:
            state_dict[r.name] = real_state[r.name] if not r.fake else torch.empty(0)
        lowered = {(m.module_path, m.name): m for m in msg.lowered_modules}
        module_tensors = {(m.module_path, m.tensor.name): m.tensor for m in msg.module_tensors}
        try:
            if msg.dialect == pb.DIALECT_EDGE:
                ep = _deserialize_edge(raw, state_dict, constants, lowered, module_tensors, self)
            else:
                ep = _deserialize_aten(raw, state_dict, constants)
        except CodecError:
            raise
        except Exception as e:
            raise ProgramDecodeError(
                f"the program's graph cannot be deserialized: {type(e).__name__}: {e}"
            ) from e
        if fakes:
            fake_mode = detect_fake_mode(
                tuple(n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder")
            )
            for r in fakes:
                ep._state_dict[r.name] = self.tensor(r, fake_mode)
        _repair(ep, list(msg.fingerprint))
        problem = first_difference(msg.fingerprint, fingerprint(ep))
        if problem is not None:
            raise FingerprintMismatch(f"the program rebuilt on the server differs: {problem}")
        _restore_metadata(ep, msg)
        return ep



_SCHEMA_MODULES = frozenset({"torch._export.serde.schema", "executorch.exir.serde.schema"})


def _memoize_schema_type_hints() -> None:
    """Make ``typing.get_type_hints`` remember its answer for the export schemas' classes.

    The schema deserializers (``_dict_to_dataclass``, in torch and in ExecuTorch) ask for the
    type hints of a schema class once per *object* they build, and resolving them was half of
    the time it took to read a graph. A class's hints never change, so for the schema modules'
    classes (and only those) they are computed once per process. Installed once; idempotent.
    """
    original = typing.get_type_hints
    if getattr(original, "_remote_partitioner_memo", False):
        return
    memo: dict[tuple[type, int], dict[str, Any]] = {}

    def get_type_hints(
        obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False
    ) -> dict[str, Any]:
        if (
            isinstance(obj, type)
            and obj.__module__ in _SCHEMA_MODULES
            and localns is None
            and not include_extras
        ):
            key = (obj, id(globalns))
            hints = memo.get(key)
            if hints is None:
                hints = memo[key] = original(obj, globalns)
            return hints
        return original(obj, globalns, localns, include_extras)

    get_type_hints._remote_partitioner_memo = True  # type: ignore[attr-defined]
    typing.get_type_hints = get_type_hints


def _deserialize_aten(
    raw: bytes, state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]
) -> ExportedProgram:
    from torch._export.serde import serialize as tser

    serialized = tser._dict_to_dataclass(tser.ExportedProgram, checked_graph_json(raw))
    return tser.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants)


def _deserialize_edge(
    raw: bytes,
    state_dict: dict[str, torch.Tensor],
    constants: dict[str, torch.Tensor],
    lowered: Mapping[tuple[str, str], pb.LoweredModule],
    module_tensors: Mapping[tuple[str, str], pb.TensorRef],
    decoder: _Decoder,
) -> ExportedProgram:
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde import serialize as eser

    class Deserializer(eser.GraphModuleDeserializer):  # type: ignore[misc,valid-type]
        """exir's deserializer, with lowered modules and get_attr tensors read by reference."""

        def _module_path(self) -> str:
            # Submodule graphs are deserialized into fresh modules; their path is tracked
            # through the stack of graph arguments being read.
            return "." .join(self._path_stack)

        def deserialize_lowered_module(self, arg: Any) -> torch.fx.Node:
            ref = json.loads(arg.arg.value).get(_LOWERED_MARKER)
            if not isinstance(ref, dict):
                raise ProgramDecodeError("malformed lowered module reference")
            m = lowered.get((str(ref.get("path")), str(ref.get("name"))))
            if m is None:
                raise ProgramDecodeError(f"lowered module {ref!r} is not in the program")
            original = decoder.program(m.original_program)
            module = LoweredBackendModule(
                original,
                m.backend_id,
                b"",
                [_compile_spec(cs) for cs in m.compile_specs],
            )
            self.module.register_module(m.name, module)
            return self.graph.get_attr(m.name)

        def deserialize_input(self, inp: Any) -> Any:
            if inp.type == "as_string" and inp.value.startswith(_GET_ATTR_MARKER):
                ref = json.loads(inp.value[len(_GET_ATTR_MARKER):])
                tensor_ref = module_tensors.get((self._module_path(), ref["target"]))
                if tensor_ref is None:
                    raise ProgramDecodeError(f"module tensor {ref!r} is not in the program")
                existing = self._get_attrs.get((id(self.graph), ref["target"]))
                if existing is not None:
                    return existing
                t = decoder.tensor(tensor_ref)
                self.module.register_buffer(ref["target"], t)  # type: ignore[attr-defined]
                node = self.graph.get_attr(ref["target"])
                node.name = ref["name"]
                self._get_attrs[(id(self.graph), ref["target"])] = node
                return node
            if inp.type == "as_graph":
                self._path_stack.append(inp.value.name)
                try:
                    return super().deserialize_input(inp)
                finally:
                    self._path_stack.pop()
            return super().deserialize_input(inp)

    serialized = export_serialize._dict_to_dataclass(
        schema.ExportedProgram, checked_graph_json(raw)
    )
    original_init = Deserializer.__init__

    def init(self: Any) -> None:
        original_init(self)
        self._path_stack = []
        self._get_attrs = {}

    Deserializer.__init__ = init  # type: ignore[method-assign]
    saved = eser.GraphModuleDeserializer
    eser.GraphModuleDeserializer = Deserializer
    try:
        return eser.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants)
    finally:
        eser.GraphModuleDeserializer = saved


def _compile_spec(cs: pb.CompileSpec) -> Any:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return CompileSpec(cs.key, bytes(cs.value))


def _repair(ep: ExportedProgram, expected: list[pb.NodeFingerprint]) -> None:
    """Undo what the serializers change, using the client's fingerprint as the reference."""
    by_graph: dict[str, list[pb.NodeFingerprint]] = {}
    for entry in expected:
        by_graph.setdefault(entry.graph, []).append(entry)
    for path, gm in graph_modules(ep.graph_module):
        want = by_graph.get(path, [])
        names: dict[str, pb.NodeFingerprint] = {e.name: e for e in want}
        graph = gm.graph
        changed = False
        # Unused getitem nodes the serializer invented.
        for node in list(graph.nodes):
            if (
                node.name not in names
                and node.op == "call_function"
                and node.target is operator.getitem
                and not node.users
            ):
                graph.erase_node(node)
                changed = True
        for node in graph.nodes:
            f = names.get(node.name)
            if f is None:
                continue
            # Placeholder targets: the deserializers name the target after the node. FX writes
            # a placeholder's target into the generated forward(): only an identifier is taken.
            if node.op == "placeholder" and node.target != f.target:
                if not f.target.isidentifier() or keyword.iskeyword(f.target):
                    raise ProgramDecodeError(
                        f"placeholder {node.name!r}: target {f.target[:100]!r} is not an "
                        "identifier"
                    )
                node.target = f.target
                changed = True
        # Positional vs keyword arguments, as the client had them.
        for node in graph.nodes:
            f = names.get(node.name)
            if f is None or node.op != "call_function":
                continue
            if len(node.args) == f.num_args and list(node.kwargs) == list(f.kwarg_names):
                continue
            values = list(node.args) + list(node.kwargs.values())
            keys = [None] * len(node.args) + list(node.kwargs)
            if len(values) != f.num_args + len(f.kwarg_names):
                continue
            kw = dict(zip(keys[len(node.args):], values[len(node.args):], strict=True))
            pos = list(node.args)
            # Move trailing keyword arguments to positions, or positions to keywords.
            while len(pos) < f.num_args and kw:
                pos.append(kw.pop(next(iter(kw))))
            if len(pos) == f.num_args and set(kw) == set(f.kwarg_names):
                node.args = tuple(pos)
                node.kwargs = {k: kw[k] for k in f.kwarg_names}
                changed = True
        for node in graph.nodes:
            f = names.get(node.name)
            if f is None:
                continue
            # Lists and tuples of arguments (higher-order operators' operands, the output
            # node's values), as the client had them.
            if node.op in ("call_function", "output") and _args_text(node) != f.args:
                args, prefix = [], "("
                for a in node.args:
                    choice = a
                    if isinstance(a, (list, tuple)):
                        flipped = tuple(a) if isinstance(a, list) else list(a)
                        if not f.args.startswith(prefix + _arg_text(a)) and f.args.startswith(
                            prefix + _arg_text(flipped)
                        ):
                            choice = flipped
                    args.append(choice)
                    prefix += _arg_text(choice) + ", "
                if _arg_text(tuple(args)) + _arg_text(dict(node.kwargs)) == f.args:
                    node.args = tuple(args)
                    changed = True
        # Node order, as the client had it: the deserializers put get_attr nodes where they
        # are first used and getitem nodes right after their producer. The client's order is a
        # topological order of the same edges (the fingerprint checks them), so it is legal.
        by_name = {n.name: n for n in graph.nodes}
        # With other nodes than the client's, leave the order: the fingerprint check names
        # the difference.
        if by_name.keys() == names.keys():
            changed |= _reorder(want, by_name)
        if changed:
            graph.lint()
            gm.recompile()


def _tensor_meta(val: Any, m: pb.NodeMetadata) -> Any:
    """``tensor_meta`` rebuilt from ``val``, shaped as the client's (see NodeMetadata)."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    if m.tensor_meta_is_none:
        return None
    if isinstance(val, torch.Tensor):
        return _extract_tensor_metadata(val)._replace(requires_grad=m.tensor_meta_requires_grad)
    if isinstance(val, (list, tuple)):
        nones = list(m.tensor_meta_none_items) or [False] * len(val)
        return type(val)(
            _extract_tensor_metadata(v) if isinstance(v, torch.Tensor) and not none else None
            for v, none in zip(val, nones, strict=False)
        )
    return None


def _restore_metadata(ep: ExportedProgram, msg: pb.Program) -> None:
    """Put back what the graph JSON dropped (see :func:`_node_metadata`)."""
    if not msg.node_metadata:
        return
    if msg.dialect == pb.DIALECT_EDGE:
        from executorch.exir.serde import serialize as eser

        deserializer: Any = eser.GraphModuleDeserializer()
    else:
        from torch._export.serde import serialize as tser

        deserializer = tser.GraphModuleDeserializer()
    nodes = {
        (path, n.name): n for path, gm in graph_modules(ep.graph_module) for n in gm.graph.nodes
    }
    for m in msg.node_metadata:
        node = nodes.get((m.node.graph, m.node.name))
        if node is None:
            raise ProgramDecodeError(
                f"metadata for node {m.node.name!r}, which is not in the graph"
            )
        if m.entries:
            try:
                node.meta.update(deserializer.deserialize_metadata(dict(m.entries)))
            except Exception as e:
                raise ProgramDecodeError(
                    f"metadata of node {m.node.name!r} cannot be read: {type(e).__name__}: {e}"
                ) from e
        if m.no_val:
            node.meta.pop("val", None)
        if m.val_is_list and isinstance(node.meta.get("val"), tuple):
            node.meta["val"] = list(node.meta["val"])
        if m.has_tensor_meta and "tensor_meta" not in node.meta:
            node.meta["tensor_meta"] = _tensor_meta(node.meta.get("val"), m)


def _reorder(want: list[pb.NodeFingerprint], by_name: dict[str, torch.fx.Node]) -> bool:
    """Move nodes into the client's order; True if any moved."""
    changed = False
    prev: torch.fx.Node | None = None
    for f in want:
        node = by_name[f.name]
        if node.op != "placeholder" and prev is not None and node.prev is not prev:
            prev.append(node)
            changed = True
        prev = node
    return changed


def decode_program(
    msg: pb.Program, blobs: Callable[[pb.Digest], bytes | bytearray | memoryview]
) -> ExportedProgram:
    """Rebuild the ExportedProgram a Program message describes.

    Args:
        msg: The program message.
        blobs: Returns a blob's bytes by digest; raises :class:`BlobMissing` if it has none.
            The tensors of a writable buffer share its memory (no copy is made: the caller
            must not reuse it for anything else); a read-only buffer is copied.

    Raises:
        BlobMissing: a blob the program names is not available.
        ProgramDecodeError: the message or its graph cannot be decoded.
        FingerprintMismatch: the rebuilt program differs from the client's fingerprint.
    """
    _memoize_schema_type_hints()
    try:
        return _Decoder(blobs).program(msg)
    except CodecError:
        raise
    except Exception as e:  # a malformed message that reached torch
        raise ProgramDecodeError(
            f"the program cannot be rebuilt: {type(e).__name__}: {str(e)[:1000]}"
        ) from e


def graph_digests(msg: pb.Program) -> Iterator[pb.Digest]:
    """The graph (JSON) blob digests of a Program message and its nested lowered programs."""
    yield msg.graph
    for lm in msg.lowered_modules:
        yield from graph_digests(lm.original_program)


def iter_digests(msg: pb.Program, *, nested: bool = True) -> Iterator[pb.Digest]:
    """Every blob digest a Program message names, with nested lowered programs' unless
    ``nested`` is false."""
    yield msg.graph
    for r in (*msg.state_dict, *msg.constants):
        if not r.fake:
            yield r.storage
    for m in msg.module_tensors:
        if not m.tensor.fake:
            yield m.tensor.storage
    if nested:
        for lm in msg.lowered_modules:
            yield from iter_digests(lm.original_program)
