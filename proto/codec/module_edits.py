"""The edits a quantizer step makes to a client's unlifted ``GraphModule``, stated on the server
and applied on the client (the module itself crossed as :mod:`.modules` says).

The server takes a :class:`ModuleSnapshot` before each quantizer step and states what the step
changed as ``GraphEdits`` (:meth:`ModuleSnapshot.edits`): new tensors, inserted ``get_attr``
nodes, changed arguments, erased nodes, plain-data node metadata -- and refuses anything else
(:class:`UnrepresentableMeta`). The client applies the edits to its own module, in place
(:func:`apply_edits`), and checks that its fingerprint then equals the server's. An edited
module is never replaced, so its node metadata that does not cross (``seq_nr``,
``original_aten``, ``example_value``, ``from_node``) and its objects' identity are kept. (A
transform whose changes edits cannot state is answered with its whole module instead:
``QuantizeResponse.transform_module``, server/quantize_call.py.)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from remote_partitioner.proto.codec.meta_values import decode_meta_value, encode_meta_value
from remote_partitioner.proto.codec.modules import (
    ANNOTATION_KEY,
    EditConflict,
    _check_path,
    _fingerprint_problem,
    _literal,
    _node_entry,
    _owner,
    _registered_tensors,
    _tensor_kind,
    module_fingerprint,
)
from remote_partitioner.proto.program_errors import (
    FingerprintMismatch,
    ProgramDecodeError,
    UnrepresentableMeta,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["ModuleSnapshot", "apply_edits"]


def _meta_signature(value: Any) -> Any:
    """A comparable stand-in for a meta value (tensors by type, dtype, shape and strides)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value).__name__, str(value.dtype), str(list(value.shape)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_meta_signature(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _meta_signature(v)) for k, v in value.items()))
    return ("value", repr(value))


#: Node metadata keys that edits never set: ``val`` (a fake tensor, made here from the graph)
#: and the annotation (which crosses with its objects' identity in ``Annotations``).
_UNEDITABLE_META = frozenset({"val", ANNOTATION_KEY})


class _NodeState:
    __slots__ = ("args", "meta", "op", "target")

    def __init__(self, node: torch.fx.Node) -> None:
        self.op = node.op
        self.target = _node_entry(node)[2]
        self.args = json.dumps([_literal(node.args), _literal(node.kwargs)])
        self.meta = {k: _meta_signature(v) for k, v in node.meta.items() if k != ANNOTATION_KEY}


class _TensorState:
    __slots__ = ("dtype", "kind", "persistent", "shape", "tensor", "version")

    def __init__(self, kind: str, persistent: bool, t: torch.Tensor) -> None:
        self.kind, self.persistent, self.tensor = kind, persistent, t
        self.dtype, self.shape, self.version = t.dtype, tuple(t.shape), t._version


def _encode_argument(value: Any, where: str) -> pb.Argument:
    if isinstance(value, torch.fx.Node):
        return pb.Argument(node=value.name)
    if value is None:
        return pb.Argument(none=True)
    if isinstance(value, bool):
        return pb.Argument(bool_value=value)
    if isinstance(value, int):
        return pb.Argument(int_value=value)
    if isinstance(value, float):
        return pb.Argument(double_value=value)
    if isinstance(value, str):
        return pb.Argument(string_value=value)
    if isinstance(value, torch.dtype):
        return pb.Argument(dtype=str(value))
    if isinstance(value, list):
        return pb.Argument(list=pb.ArgumentList(items=[_encode_argument(v, where) for v in value]))
    if isinstance(value, tuple):
        return pb.Argument(
            tuple=pb.ArgumentList(items=[_encode_argument(v, where) for v in value])
        )
    raise UnrepresentableMeta(f"{where}: argument {value!r} ({type(value).__name__}) refused")


_DTYPES: dict[str, torch.dtype] = {
    str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}


def _dtype(name: str, where: str) -> torch.dtype:
    d = _DTYPES.get(name)
    if d is None:
        raise ProgramDecodeError(f"{where}: unknown dtype {name!r}")
    return d


def _decode_argument(arg: pb.Argument, node: Callable[[str], torch.fx.Node], where: str) -> Any:
    kind = arg.WhichOneof("kind")
    if kind == "node":
        return node(arg.node)
    if kind == "none":
        return None
    if kind == "bool_value":
        return arg.bool_value
    if kind == "int_value":
        return arg.int_value
    if kind == "double_value":
        return arg.double_value
    if kind == "string_value":
        return arg.string_value
    if kind == "dtype":
        return _dtype(arg.dtype, where)
    if kind == "list":
        return [_decode_argument(a, node, where) for a in arg.list.items]
    if kind == "tuple":
        return tuple(_decode_argument(a, node, where) for a in arg.tuple.items)
    raise ProgramDecodeError(f"{where}: an argument has no value")


def _tensor_bytes(t: torch.Tensor, target: str) -> bytes:
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(t) or t.device.type != "cpu":
        raise UnrepresentableMeta(
            f"new tensor {target!r}: its data is not here ({type(t).__name__} on {t.device})"
        )
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return bytes(flat.view(torch.uint8).numpy().tobytes())


class ModuleSnapshot:
    """A module as it was before a quantizer step, to state what the step changed.

    It keeps each node's op, target, arguments and meta (as comparable signatures), the
    registered tensors and the submodule names; not a copy of the module.
    """

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.order = [n.name for n in gm.graph.nodes]
        self.nodes = {n.name: _NodeState(n) for n in gm.graph.nodes}
        self.tensors = {
            name: _TensorState(kind, persistent, t)
            for name, kind, persistent, t in _registered_tensors(gm)
        }
        self.modules = [name for name, _ in gm.named_modules(remove_duplicate=False)]

    def edits(self, gm: torch.fx.GraphModule) -> pb.GraphEdits:
        """What changed from the snapshot to ``gm`` (the snapshotted module mutated, or the
        module a step returned), as ``GraphEdits`` with ``fingerprint = module_fingerprint(gm)``.

        Representable: new parameters/buffers on existing modules (``NewTensor`` with their
        data, in registration order), inserted ``get_attr`` nodes reading registered tensors
        (with the node each precedes), changed args/kwargs of existing nodes (nodes, ints,
        floats, bools, strings, None, lists, tuples, dtypes), erased nodes (users first), meta
        keys set, changed or removed on existing nodes whose values are plain data
        (``MetaEdit``; not ``val``). The ``quantization_annotation`` meta key is ignored.

        Raises:
            UnrepresentableMeta: naming the node, key or target, for anything else: an
                inserted node that is not ``get_attr`` (or reads something not registered), an
                inserted node with meta other than ``val``, a changed op or target, a reordering
                that is not an insertion, a changed ``val`` or a meta value that is not plain
                data on an existing node, a new or removed submodule, a changed or removed
                existing tensor, a new tensor whose data is not here (a ``FakeTensor``).
        """
        edits = pb.GraphEdits()
        # Modules and tensors.
        modules = [name for name, _ in gm.named_modules(remove_duplicate=False)]
        if modules != self.modules:
            added = [m for m in modules if m not in self.modules]
            removed = [m for m in self.modules if m not in modules]
            raise UnrepresentableMeta(
                f"submodules changed: added {added}, removed {removed}"
                if added or removed else "submodules were reordered"
            )
        now = {name: (kind, persistent, t) for name, kind, persistent, t in _registered_tensors(gm)}
        for name, was in self.tensors.items():
            if name not in now:
                raise UnrepresentableMeta(f"tensor {name!r} was removed")
            kind, persistent, t = now[name]
            same = (
                kind == was.kind and persistent == was.persistent and t.dtype == was.dtype
                and tuple(t.shape) == was.shape
            )
            if same and t is was.tensor:
                same = t._version == was.version
            elif same:
                from torch._subclasses.fake_tensor import is_fake

                same = is_fake(t) == is_fake(was.tensor) and (
                    is_fake(t) or torch.equal(t.detach(), was.tensor.detach())
                )
            if not same:
                raise UnrepresentableMeta(f"tensor {name!r} was changed")
        for name, (kind, persistent, t) in now.items():
            if name in self.tensors:
                continue
            edits.tensors.append(
                pb.NewTensor(
                    target=name, parameter=kind == "parameter", persistent=persistent,
                    dtype=str(t.dtype), sizes=list(t.shape), data=_tensor_bytes(t, name),
                )
            )
        # Nodes.
        nodes = list(gm.graph.nodes)
        names = [n.name for n in nodes]
        kept = [n for n in names if n in self.nodes]
        kept_set = set(kept)
        erased = [n for n in self.order if n not in kept_set]
        previous = [n for n in self.order if n in kept_set]
        if kept != previous:
            first = next(a for a, b in zip(kept, previous, strict=True) if a != b)
            raise UnrepresentableMeta(f"node {first!r} was moved (not an insertion)")
        for i, node in enumerate(nodes):
            old = self.nodes.get(node.name)
            if old is None:
                if node.op != "get_attr":
                    raise UnrepresentableMeta(
                        f"node {node.name!r}: inserted {node.op} node (only get_attr nodes can "
                        "be inserted)"
                    )
                if _tensor_kind(gm, str(node.target)) is None:
                    raise UnrepresentableMeta(
                        f"node {node.name!r}: inserted get_attr of {node.target!r}, not a "
                        "registered tensor"
                    )
                extra = sorted(k for k in node.meta if k not in ("val", ANNOTATION_KEY))
                if extra:
                    raise UnrepresentableMeta(f"node {node.name!r}: inserted with meta {extra}")
                edits.inserted.append(
                    pb.InsertedNode(
                        name=node.name, op="get_attr", target=str(node.target),
                        before=nodes[i + 1].name,
                    )
                )
                continue
            state = _NodeState(node)
            if state.op != old.op or state.target != old.target:
                raise UnrepresentableMeta(
                    f"node {node.name!r}: {old.op} {old.target} became {state.op} {state.target}"
                )
            for key in sorted(set(state.meta) | set(old.meta)):
                if state.meta.get(key) != old.meta.get(key):
                    change = ("new" if key not in old.meta
                              else "removed" if key not in state.meta else "changed")
                    where = f"node {node.name!r}: meta {key!r} {change}"
                    if key in _UNEDITABLE_META:
                        raise UnrepresentableMeta(where)
                    if key not in node.meta:
                        edits.meta.append(pb.MetaEdit(node=node.name, key=key, removed=True))
                        continue
                    try:
                        value = encode_meta_value(node.meta[key], where=where)
                    except UnrepresentableMeta as e:
                        raise UnrepresentableMeta(f"{e} (only plain data crosses)") from None
                    edits.meta.append(pb.MetaEdit(node=node.name, key=key, value=value))
            if state.args != old.args:
                where = f"node {node.name!r}"
                edits.changed.append(
                    pb.ChangedArguments(
                        name=node.name,
                        args=[_encode_argument(a, where) for a in node.args],
                        kwargs=[
                            pb.NamedArgument(name=k, value=_encode_argument(v, where))
                            for k, v in node.kwargs.items()
                        ],
                    )
                )
        edits.erased.extend(reversed(erased))  # later nodes first: users before their inputs
        edits.fingerprint = module_fingerprint(gm)
        return edits


def _tensor_from(t: pb.NewTensor) -> torch.Tensor:
    dtype = _dtype(t.dtype, f"tensor {t.target!r}")
    sizes = list(t.sizes)
    if any(s < 0 for s in sizes):
        raise ProgramDecodeError(f"tensor {t.target!r}: negative size")
    numel = 1
    for s in sizes:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(t.data) != numel * itemsize:
        raise ProgramDecodeError(
            f"tensor {t.target!r}: {len(t.data)} bytes for {numel} elements of {t.dtype}"
        )
    if sys.byteorder != "little" and itemsize > 1:
        raise ProgramDecodeError("tensor data is little endian; this machine is not")
    if numel == 0:
        return torch.empty(sizes, dtype=dtype)
    raw = torch.frombuffer(bytearray(t.data), dtype=torch.uint8)
    return raw.view(dtype).reshape(sizes)


def apply_edits(
    gm: torch.fx.GraphModule, edits: pb.GraphEdits, *, expected: str | None = None
) -> None:
    """Apply ``edits`` to ``gm`` in place (the client's side), then check the fingerprint.

    In field order: register the tensors (``register_parameter`` / ``register_buffer`` with the
    persistent flag) on their existing modules; insert each ``get_attr`` node before its
    anchor with ``graph.create_node(..., name=...)``, its ``val`` made by the graph's own fake
    mode (``torch._guards.detect_fake_mode`` over the nodes' ``val``) with
    ``from_tensor(tensor, static_shapes=True)``, as ExecuTorch's ``_convert_scalars_to_attrs``
    does; set changed args/kwargs; erase nodes; set or remove meta keys; ``gm.recompile()``.

    ``expected``, if given, is the fingerprint ``gm`` must have before the edits (the one the
    client sent, ``UnliftTable.fingerprint``): checked before anything changes. Without it a
    module the edits do not fit is refused only afterwards, when it may have been changed.

    Raises:
        EditConflict: (a ``ValueError``) a tensor's target is already an attribute of ``gm``,
            or an inserted node could not get its name, or a node to erase still has users.
        ProgramDecodeError: the edits are malformed (bad target path, dtype, data size, an
            argument without a value).
        FingerprintMismatch: ``gm``'s fingerprint is not ``expected``, the edits name nodes or
            modules ``gm`` does not have, or ``gm``'s fingerprint afterwards differs from
            ``edits.fingerprint`` (``gm`` is not the module
            the edits were computed for).
    """
    from torch._guards import detect_fake_mode

    if expected is not None:
        problem = _fingerprint_problem(gm, expected, "the module before the edits")
        if problem is not None:
            raise FingerprintMismatch(problem)
    graph = gm.graph
    nodes = {n.name: n for n in graph.nodes}
    # Check what can be checked before changing anything.
    owners: list[tuple[torch.nn.Module, str, torch.Tensor, pb.NewTensor]] = []
    for t in edits.tensors:
        parts = _check_path(t.target, "new tensor")
        owner = _owner(gm, parts, create=False)
        if owner is None:
            raise FingerprintMismatch(f"new tensor {t.target!r}: the module has no such owner")
        if hasattr(owner, parts[-1]):
            raise EditConflict(f"new tensor {t.target!r}: the module already has that attribute")
        owners.append((owner, parts[-1], _tensor_from(t), t))
    names = set(nodes)
    for ins in edits.inserted:
        if ins.op != "get_attr":
            raise ProgramDecodeError(f"inserted node {ins.name!r}: op {ins.op!r} refused")
        _check_path(ins.target, f"inserted node {ins.name!r}")
        if ins.name in names:
            raise EditConflict(f"inserted node {ins.name!r}: the graph has a node of that name")
        if ins.before not in names:
            raise FingerprintMismatch(f"inserted node {ins.name!r}: no node {ins.before!r}")
        names.add(ins.name)
    for c in edits.changed:
        if c.name not in nodes:
            raise FingerprintMismatch(f"changed node {c.name!r} is not in the module")
    for name in edits.erased:
        if name not in nodes:
            raise FingerprintMismatch(f"erased node {name!r} is not in the module")
    erased = set(edits.erased)
    meta = list(edits.meta)
    for m in meta:
        if m.key in _UNEDITABLE_META or not m.key:
            raise ProgramDecodeError(f"node {m.node!r}: meta {m.key!r} cannot be edited")
        if m.node not in nodes or m.node in erased:
            raise FingerprintMismatch(f"meta of node {m.node!r}, not in the module after the edits")
        if not m.removed and m.value.WhichOneof("value") is None:
            raise ProgramDecodeError(f"node {m.node!r}: meta {m.key!r} has no value")

    for owner, field, tensor, t in owners:
        if t.parameter:
            owner.register_parameter(
                field,
                torch.nn.Parameter(
                    tensor, requires_grad=tensor.is_floating_point() or tensor.is_complex()
                ),
            )
        else:
            owner.register_buffer(field, tensor, persistent=t.persistent)
    if len(edits.inserted):
        fake_mode = detect_fake_mode(tuple(n.meta.get("val") for n in graph.nodes))
        for ins in edits.inserted:
            found = _tensor_kind(gm, ins.target)
            if found is None:
                raise FingerprintMismatch(
                    f"inserted node {ins.name!r}: {ins.target!r} is not a registered tensor"
                )
            with graph.inserting_before(nodes[ins.before]):
                new = graph.create_node("get_attr", ins.target, (), {}, name=ins.name)
            if new.name != ins.name:
                graph.erase_node(new)
                raise EditConflict(f"inserted node {ins.name!r} came out as {new.name!r}")
            if fake_mode is not None:
                new.meta["val"] = fake_mode.from_tensor(found[2], static_shapes=True)
            nodes[new.name] = new

    def node(name: str) -> torch.fx.Node:
        found = nodes.get(name)
        if found is None:
            raise FingerprintMismatch(f"an argument names node {name!r}, not in the module")
        return found

    for c in edits.changed:
        where = f"changed node {c.name!r}"
        target = nodes[c.name]
        target.args = tuple(_decode_argument(a, node, where) for a in c.args)
        target.kwargs = {k.name: _decode_argument(k.value, node, where) for k in c.kwargs}
    for name in edits.erased:
        victim = nodes.pop(name)
        if victim.users:
            raise EditConflict(f"erased node {name!r} still has users {list(victim.users)}")
        graph.erase_node(victim)
    for m in meta:
        if m.removed:
            nodes[m.node].meta.pop(m.key, None)
        else:
            nodes[m.node].meta[m.key] = decode_meta_value(m.value)
    gm.recompile()
    problem = _fingerprint_problem(gm, edits.fingerprint, "the module after the edits")
    if problem is not None:
        raise FingerprintMismatch(problem)
