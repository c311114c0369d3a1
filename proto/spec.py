"""Partitioner spec values on the wire: Python scalars <-> ``SpecValue``/``SpecEntry``."""

from __future__ import annotations

from collections.abc import Mapping

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

SpecScalar = bool | int | float | str | bytes
"""The types a spec value may have."""


def spec_value(key: str, value: object) -> pb.SpecValue:
    """A Python scalar as a SpecValue; TypeError naming the key for anything else."""
    if isinstance(value, bool):  # before int: bool is an int
        return pb.SpecValue(bool_value=value)
    if isinstance(value, int):
        return pb.SpecValue(int_value=value)
    if isinstance(value, float):
        return pb.SpecValue(double_value=value)
    if isinstance(value, str):
        return pb.SpecValue(string_value=value)
    if isinstance(value, (bytes, bytearray)):
        return pb.SpecValue(bytes_value=bytes(value))
    raise TypeError(
        f"spec key {key!r}: a {type(value).__name__} cannot be sent; "
        "use bool, int, float, str or bytes"
    )


def spec_entries(spec: Mapping[str, object] | None) -> list[pb.SpecEntry]:
    """A spec mapping as SpecEntry messages, in its order."""
    return [pb.SpecEntry(key=k, value=spec_value(k, v)) for k, v in (spec or {}).items()]
