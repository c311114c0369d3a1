"""What ``Preprocess`` carries besides programs: the node metadata a backend's preprocess reads,
and ``PreprocessResult`` <-> ``PreprocessOutput``.

Both sides use these: the client encodes node metadata and decodes results, the server applies
node metadata and encodes results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch.export import ExportedProgram

from remote_partitioner.proto.codec.graphs import graph_modules
from remote_partitioner.proto.codec.meta_values import decode_meta_value, encode_meta_value
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.program_errors import ProgramDecodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = [
    "INLINE_PROCESSED_BYTES",
    "apply_node_meta",
    "decode_preprocess_result",
    "encode_preprocess_result",
    "extra_node_meta",
]

#: Processed bytes up to this size also travel inline in the response.
INLINE_PROCESSED_BYTES = 1 << 20

#: Node metadata the ``Program`` message already carries.
_CARRIED = frozenset({
    "val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn",
    "debug_handle", "from_node", "custom",
})
#: Node metadata that does not cross and no hosted backend's preprocess reads (tensors,
#: operator objects, tracing leftovers).
_NOT_SENT = frozenset({"seq_nr", "example_value", "original_aten", "desc", "eager_input_vals"})


def extra_node_meta(ep: ExportedProgram) -> list[pb.MetaUpdate]:
    """The ``node.meta`` entries of every graph of ``ep`` that the program message does not
    carry (what a partitioner wrote: ``delegation_tag``, XNNPACK's ``xnn_partitioner_config``
    and ``IS_IMPLICIT_Q_DQ_TAG``, ...), in graph order.

    Raises:
        UnrepresentableMeta: a value that cannot cross; the message names graph, node and key.
    """
    out: list[pb.MetaUpdate] = []
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            for key, value in node.meta.items():
                if key in _CARRIED or key in _NOT_SENT:
                    continue
                where = f"graph {path or '<root>'!r}, node {node.name!r}, meta key {key!r}"
                out.append(pb.MetaUpdate(
                    node=pb.NodeRef(graph=path, name=node.name), key=key,
                    value=encode_meta_value(value, where=where),
                ))
    return out


def apply_node_meta(ep: ExportedProgram, updates: Iterable[pb.MetaUpdate]) -> None:
    """Set the entries :func:`extra_node_meta` listed on the rebuilt program's nodes.

    Raises:
        ProgramDecodeError: an entry names a node the program does not have, or a key the
            program message carries.
    """
    nodes = {
        (path, node.name): node
        for path, gm in graph_modules(ep.graph_module)
        for node in gm.graph.nodes
    }
    for u in updates:
        node = nodes.get((u.node.graph, u.node.name))
        if node is None:
            raise ProgramDecodeError(
                f"node_meta names node {u.node.name!r} of graph {u.node.graph or '<root>'!r}, "
                "which the program does not have"
            )
        if u.key in _CARRIED:
            raise ProgramDecodeError(f"node_meta may not set {u.key!r}: the program carries it")
        node.meta[u.key] = decode_meta_value(u.value)


def encode_preprocess_result(result: Any) -> tuple[pb.PreprocessOutput, dict[str, bytes]]:
    """A ``PreprocessResult`` as a message, and the blobs it names (digest hash -> bytes):
    the processed bytes and every named data buffer.

    Raises:
        UnrepresentableMeta: a debug handle map or ``_delegate_info_meta`` that cannot cross.
        TypeError: the backend returned something that is not a ``PreprocessResult``.
    """
    from executorch.exir.backend.backend_details import PreprocessResult

    if not isinstance(result, PreprocessResult):
        raise TypeError(f"preprocess returned {type(result).__name__}, not a PreprocessResult")
    blobs: dict[str, bytes] = {}

    def blob(data: Any) -> pb.Digest:
        raw = data if isinstance(data, bytes) else _buffer_bytes(data)
        d = digest_of(raw)
        blobs[d.hash] = raw
        return d

    processed = bytes(result.processed_bytes)
    out = pb.PreprocessOutput(processed_bytes=blob(processed))
    if len(processed) <= INLINE_PROCESSED_BYTES:
        out.processed_inline = processed
    if result.debug_handle_map is not None:
        out.has_debug_handle_map = True
        for k, v in result.debug_handle_map.items():
            where = f"debug_handle_map[{k!r}]"
            entry = out.debug_handle_map.add(handles=encode_meta_value(v, where=where))
            if isinstance(k, str):
                entry.str_key = k
            elif isinstance(k, int) and not isinstance(k, bool):
                entry.int_key = k
            else:
                raise TypeError(f"debug_handle_map key {k!r} is neither int nor str")
    store = result.data_store_output
    if store is not None:
        msg = out.data_store_output
        msg.SetInParent()
        msg.buffers.extend(blob(b) for b in store.buffers)
        msg.pte_data.extend(_entry(k, e) for k, e in store.pte_data.items())
        for filename, entries in store.external_data.items():
            msg.external_data.add(
                filename=filename, entries=[_entry(k, e) for k, e in entries.items()]
            )
    if result._delegate_info_meta is not None:
        out.delegate_info_meta.CopyFrom(
            encode_meta_value(result._delegate_info_meta, where="_delegate_info_meta")
        )
    return out, blobs


def decode_preprocess_result(
    msg: pb.PreprocessOutput, blob: Callable[[pb.Digest], bytes]
) -> Any:
    """A ``PreprocessOutput`` as the ``PreprocessResult`` the backend returned; ``blob``
    gives the bytes of a digest the message names (processed bytes not inline, buffers)."""
    from executorch.exir._serialize._named_data_store import NamedDataStoreOutput
    from executorch.exir.backend.backend_details import PreprocessResult

    d = msg.processed_bytes
    processed = (
        bytes(msg.processed_inline) if len(msg.processed_inline) == d.size_bytes else blob(d)
    )
    debug_handle_map: dict[Any, Any] | None = None
    if msg.has_debug_handle_map:
        debug_handle_map = {
            getattr(e, e.WhichOneof("key") or "int_key"): decode_meta_value(e.handles)
            for e in msg.debug_handle_map
        }
    store = None
    if msg.HasField("data_store_output"):
        s = msg.data_store_output
        store = NamedDataStoreOutput(
            buffers=[blob(b) for b in s.buffers],
            pte_data={e.key: _data_entry(e) for e in s.pte_data},
            external_data={
                x.filename: {e.key: _data_entry(e) for e in x.entries} for x in s.external_data
            },
        )
    return PreprocessResult(
        processed_bytes=processed,
        debug_handle_map=debug_handle_map,
        data_store_output=store,
        _delegate_info_meta=(
            decode_meta_value(msg.delegate_info_meta)
            if msg.HasField("delegate_info_meta") else None
        ),
    )


def _buffer_bytes(data: Any) -> bytes:
    """A named data buffer (``bytes`` or ExecuTorch's file-backed buffer) as bytes."""
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    to_bytes = getattr(data, "to_bytes", None)
    if callable(to_bytes):
        return bytes(to_bytes())
    raise TypeError(f"a named data buffer of type {type(data).__name__}")


def _entry(key: str, e: Any) -> pb.NamedDataEntry:
    out = pb.NamedDataEntry(key=key, buffer_index=e.buffer_index, alignment=e.alignment)
    if e.tensor_layout is not None:
        layout = e.tensor_layout
        out.tensor_layout.CopyFrom(pb.NamedTensorLayout(
            scalar_type=int(layout.scalar_type), sizes=list(layout.sizes),
            dim_order=list(layout.dim_order),
        ))
    return out


def _data_entry(e: pb.NamedDataEntry) -> Any:
    from executorch.exir._serialize.data_serializer import DataEntry
    from executorch.exir.scalar_type import ScalarType
    from executorch.exir.tensor_layout import TensorLayout

    layout = None
    if e.HasField("tensor_layout"):
        t = e.tensor_layout
        layout = TensorLayout(ScalarType(t.scalar_type), list(t.sizes), list(t.dim_order))
    return DataEntry(buffer_index=e.buffer_index, alignment=e.alignment, tensor_layout=layout)
