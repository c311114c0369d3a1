"""Encoding: ``ExportedProgram`` -> ``Program`` message and the blobs it names.

:class:`Encoder` walks one program (and the original programs of its lowered modules): tensors
become ``TensorRef``s naming their storage's blob, the graph becomes the export schema's JSON
(:mod:`~remote_partitioner.proto.codec.serializers`) with process-local ids renumbered, and what
that JSON drops is sent beside it as ``NodeMetadata``.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import re
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.fingerprint import fingerprint
from remote_partitioner.proto.codec.graphs import graph_modules
from remote_partitioner.proto.codec.serializers import (
    REWRITTEN_KEYS,
    edge_metadata_serializer_class,
    fast_unions,
    serialize_aten,
    serialize_edge,
)
from remote_partitioner.proto.codec.verifiers import edge_verifier_message
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.program_errors import ProgramEncodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["DigestCache", "EncodedProgram", "Encoder", "encode_program"]


#: Storages at least this large are hashed on several threads (see DigestCache.prefetch).
_PARALLEL_BYTES = 1 << 20


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
    #: The bytes of the distinct storages of the real tensors sent as metadata only
    #: (``encode_program(..., withhold=True)``).
    withheld_bytes: int = 0

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
        """The digest of ``data``, the bytes of ``t``'s storage: remembered, or computed."""
        hit = self._hit(t)
        if hit is not None:
            return hit
        return self._remember(t, digest_of(data))

    def prefetch(self, tensors: Iterable[torch.Tensor]) -> None:
        """Hash the storages of ``tensors`` not remembered yet, several at a time (hashlib
        releases the GIL), so that encoding then finds them all remembered."""
        pending: dict[tuple[int, int], torch.Tensor] = {}
        for t in tensors:
            if (
                isinstance(t, torch.Tensor)
                and not isinstance(t, torch._subclasses.fake_tensor.FakeTensor)
                and t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized
                and self._hit(t) is None
            ):
                storage = t.untyped_storage()
                pending.setdefault((storage.data_ptr(), storage.nbytes()), t)
        large = [t for t in pending.values() if t.untyped_storage().nbytes() >= _PARALLEL_BYTES]
        workers = min(len(large), os.cpu_count() or 1)
        if workers < 2:
            return  # hashed as they are encoded
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(lambda t: digest_of(_storage_bytes(t)), large))
        for t, digest in zip(large, digests, strict=True):
            self._remember(t, digest)

    def _hit(self, t: torch.Tensor) -> pb.Digest | None:
        storage = t.untyped_storage()
        hit = self._entries.get((storage.data_ptr(), storage.nbytes()))
        if hit is not None and hit[1] == t._version and hit[0]() is not None:
            return hit[2]
        return None

    def _remember(self, t: torch.Tensor, digest: pb.Digest) -> pb.Digest:
        storage = t.untyped_storage()
        try:
            ref: Any = weakref.ref(storage)
        except TypeError:
            return digest
        self._entries[(storage.data_ptr(), storage.nbytes())] = (ref, t._version, digest)
        return digest


def _dialect_of(ep: ExportedProgram) -> pb.Dialect:
    """Edge if any of ``ep``'s verifiers is ExecuTorch's Edge verifier, else ATen."""
    dialects = {v.dialect for v in ep.verifiers}
    if "EDGE" in dialects:
        return pb.DIALECT_EDGE
    return pb.DIALECT_ATEN


#: Metadata strings holding ``id()``s of the exporting process, and how each is made canonical.
_PROCESS_IDS = {
    "from_node": "_canonical_from_node",
    "nn_module_stack": "_canonical_module_stack",
}
assert set(_PROCESS_IDS) == REWRITTEN_KEYS  # the one-pass rewrite sees the same keys

#: An object's address as its default ``repr`` writes it (``<... at 0x7f3a...>``).
_ADDRESS = re.compile(r" at 0x([0-9a-fA-F]+)>")


class Encoder:
    """Encodes one program and the original programs of its lowered modules, collecting the
    blobs they name (each storage once) in :attr:`blobs`."""

    def __init__(
        self, digests: DigestCache | None, *, withhold: bool = False,
        withhold_lowered: bool = False,
    ) -> None:
        self.blobs: dict[str, memoryview | bytes] = {}
        self.digests = digests or DigestCache()
        #: Send real tensors as metadata only (``TensorRef.withheld``): no storage is read,
        #: hashed or added to the blobs.
        self.withhold = withhold
        #: Send lowered modules without their original programs
        #: (``LoweredModule.original_withheld``).
        self.withhold_lowered = withhold_lowered
        #: The bytes of the distinct storages of the real tensors withheld.
        self.withheld_bytes = 0
        # storage key -> digest, for this encoding
        self._storages: dict[tuple[int, int], pb.Digest] = {}
        # storage key -> the number naming a withheld storage in this encoding
        self._withheld: dict[tuple[int, int], int] = {}
        # ``from_node`` graph ids (addresses of this process's graphs) -> 0, 1, 2, ...
        self._graph_ids: dict[int, int] = {}
        # numeric ``nn_module_stack`` keys (addresses of this process's modules) -> 0, 1, ...
        self._module_ids: dict[str, str] = {}
        # object addresses in ``from_node`` targets (``<built-in method mm of type object at
        # 0x7f...>``: the repr of a builtin the graph called) -> 0, 1, 2, ...
        self._addresses: dict[str, int] = {}

    def graph_json(
        self, tree: Any, encoder_cls: type[json.JSONEncoder], *, allow_nan: bool
    ) -> bytes:
        """The schema object's dict ``tree`` as JSON bytes (written as its serializer writes
        it), with process-local ids made canonical."""
        return json.dumps(
            self.canonical_graph_ids(tree), cls=encoder_cls, allow_nan=allow_nan
        ).encode("utf-8")

    def schema_json(
        self, schema_obj: Any, to_dict: Any, encoder_cls: type[json.JSONEncoder], *,
        allow_nan: bool,
    ) -> bytes:
        """The schema object ``schema_obj`` as JSON bytes, as its serializer writes it with
        its ``_dataclass_to_dict`` ``to_dict``, process-local ids made canonical: in one pass
        with the codec's :class:`~.serializers.DataclassToDict` (the same result as
        converting and then :meth:`canonical_graph_ids`), else in two."""
        from remote_partitioner.proto.codec.serializers import DataclassToDict

        if isinstance(to_dict, DataclassToDict):
            tree = to_dict.convert(schema_obj, self._canonical_entry)
            return json.dumps(tree, cls=encoder_cls, allow_nan=allow_nan).encode("utf-8")
        return self.graph_json(to_dict(schema_obj), encoder_cls, allow_nan=allow_nan)

    def _canonical_entry(self, key: str, value: str) -> str:
        return getattr(self, _PROCESS_IDS[key])(value)  # type: ignore[no-any-return]

    def canonical_graph_ids(self, tree: Any) -> Any:
        """``tree`` with the graph ids and the object addresses in targets of every
        ``from_node`` string, and the numeric keys of every ``nn_module_stack`` string,
        renumbered 0, 1, 2, ... in order of first appearance in this encoding.

        All are ``id()``s of objects of the exporting process (graphs, modules, the builtin a
        node called, whose ``repr`` names its address: ``<built-in method mm of type object
        at 0x7f...>``): memory addresses that change from run to run and mean nothing
        elsewhere. Only which nodes share one is read (ExecuTorch's debug handles group nodes
        by graph id), and renumbering keeps that (distinct ids stay distinct), while the same
        program now encodes to the same bytes in every process, so that its blobs and cached
        results are found again.
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

        ids = self._graph_ids

        # Depth first, in order; ``json.loads`` builds plain lists and dicts only, so the
        # scalars of a list are skipped without a call.
        def walk(value: Any) -> None:
            if type(value) is list:
                for v in value:
                    if type(v) is dict or type(v) is list:
                        walk(v)
            elif type(value) is dict:
                gid = value.get("graph_id")
                if isinstance(gid, int):
                    value["graph_id"] = ids.setdefault(gid, len(ids))
                target = value.get("target")
                if type(target) is str and " at 0x" in target:
                    value["target"] = _ADDRESS.sub(self._canonical_address, target)
                walk(value.get("from_node"))

        walk(sources)
        return json.dumps(sources)

    def _canonical_address(self, match: re.Match[str]) -> str:
        address = match.group(1).lower()
        number = self._addresses.setdefault(address, len(self._addresses))
        return f" at 0x{number:x}>"

    def _canonical_module_stack(self, text: str) -> str:
        # "key,path,type;key,path,type": a strict export's keys are module addresses, or
        # "address@n" for the n-th further call of one module.
        items = []
        for item in text.split(";"):
            key, sep, rest = item.partition(",")
            address, at, call = key.partition("@")
            if sep and address.isdigit() and (not at or call.isdigit()):
                key = self._module_ids.setdefault(address, str(len(self._module_ids))) + at + call
            items.append(key + sep + rest)
        return ";".join(items)

    def blob(self, data: memoryview | bytes) -> pb.Digest:
        """Add ``data`` to the blobs; its digest."""
        d = digest_of(data)
        self.blobs.setdefault(d.hash, data)
        return d

    def tensor(self, name: str, t: torch.Tensor) -> pb.TensorRef:
        """``t`` as a TensorRef, its storage added to the blobs (a FakeTensor: metadata only;
        with :attr:`withhold`, a real tensor too, marked withheld).

        Raises:
            ProgramEncodeError: ``t`` is not a tensor, or not a dense CPU one.
        """
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
        if self.withhold:
            number = self._withheld.get(key)
            if number is None:
                number = self._withheld[key] = len(self._withheld)
                self.withheld_bytes += storage.nbytes()
            ref.withheld = True
            ref.withheld_storage = number
            ref.withheld_storage_bytes = storage.nbytes()
            return ref
        digest = self._storages.get(key)
        if digest is None:
            data = _storage_bytes(t)
            digest = self.digests.storage_digest(t, data)
            self._storages[key] = digest
            self.blobs.setdefault(digest.hash, data)
        ref.storage.CopyFrom(digest)
        return ref

    def program(self, ep: ExportedProgram) -> pb.Program:
        """``ep`` as a Program message (see :func:`encode_program`)."""
        dialect = _dialect_of(ep)
        lowered: list[pb.LoweredModule] = []
        module_tensors: list[pb.ModuleTensor] = []
        paths = {id(m): p for p, m in graph_modules(ep.graph_module)}
        if dialect == pb.DIALECT_EDGE:
            graph_json = serialize_edge(ep, self, lowered, module_tensors, paths)
        else:
            graph_json = serialize_aten(ep, self)
        msg = pb.Program(dialect=dialect)
        msg.graph.CopyFrom(self.blob(graph_json))
        msg.state_dict.extend(self.tensor(k, v) for k, v in ep.state_dict.items())
        msg.constants.extend(self.tensor(k, v) for k, v in ep.constants.items())
        msg.module_tensors.extend(module_tensors)
        msg.lowered_modules.extend(lowered)
        msg.fingerprint.extend(fingerprint(ep))
        msg.node_metadata.extend(_node_metadata(ep, dialect, self))
        if dialect == pb.DIALECT_EDGE:
            verifier = edge_verifier_message(ep)
            if verifier is not None:
                msg.edge_verifier.CopyFrom(verifier)
        return msg


def _metadata_serializer(ep: ExportedProgram, dialect: pb.Dialect) -> Any:
    """The serializer whose ``serialize_metadata`` writes ``ep``'s node metadata."""
    if dialect == pb.DIALECT_EDGE:
        return edge_metadata_serializer_class()(ep.graph_signature, ep.module_call_graph)
    from torch._export.serde import serialize as tser

    return tser.GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)


def _node_metadata(
    ep: ExportedProgram, dialect: pb.Dialect, encoder: Encoder
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


def encode_program(
    ep: ExportedProgram, *, digests: DigestCache | None = None, withhold: bool = False,
    withhold_lowered: bool = False,
) -> EncodedProgram:
    """Encode ``ep`` as a Program message and the blobs it names.

    Args:
        ep: An ATen or Edge program. Its state_dict may hold ``FakeTensor``s (they cross as
            metadata only); its constants and other tensors must be dense CPU tensors.
        digests: A cache of storage digests, so that a storage is hashed once per lowering.
        withhold: Send every real tensor (parameters, buffers, constants, module tensors, the
            lowered modules' programs' too) as metadata only: ``TensorRef.withheld``, with a
            number per distinct storage so that shared storage stays shared. No tensor data is
            read or hashed, and the blobs hold the graphs only.
        withhold_lowered: Send each lowered module without its original program
            (``LoweredModule.original_withheld``): a hook on an already lowered program then
            costs its own graph only.

    Raises:
        ProgramEncodeError: the program holds something that cannot cross (custom objects,
            non-CPU tensors, a node the serializer refuses).
    """
    encoder = Encoder(digests, withhold=withhold, withhold_lowered=withhold_lowered)
    if not withhold:
        encoder.digests.prefetch([*ep.state_dict.values(), *ep.constants.values()])
    with fast_unions():
        message = encoder.program(ep)
    return EncodedProgram(
        message=message, blobs=encoder.blobs, withheld_bytes=encoder.withheld_bytes,
    )
