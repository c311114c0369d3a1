"""Node metadata values on the wire: plain Python data <-> ``MetaValue``.

What a partitioner writes into ``node.meta`` besides its delegation tag (XNNPACK's
``IS_IMPLICIT_Q_DQ_TAG`` and ``xnn_partitioner_config``) crosses back to the client this way.
"""

from __future__ import annotations

from typing import Any

from remote_partitioner.proto.program_errors import UnrepresentableMeta
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["decode_meta_value", "encode_meta_value"]


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
