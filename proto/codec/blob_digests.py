"""The blob digests a ``Program`` message names (to ask which are missing, to fetch them)."""

from __future__ import annotations

from collections.abc import Iterator

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["graph_digests", "has_withheld", "iter_digests"]


def graph_digests(msg: pb.Program) -> Iterator[pb.Digest]:
    """The graph (JSON) blob digests of a Program message and its nested lowered programs
    (those not withheld)."""
    yield msg.graph
    for lm in msg.lowered_modules:
        if not lm.original_withheld:
            yield from graph_digests(lm.original_program)


def iter_digests(msg: pb.Program, *, nested: bool = True) -> Iterator[pb.Digest]:
    """Every blob digest a Program message names, with nested lowered programs' unless
    ``nested`` is false."""
    yield msg.graph
    for r in (*msg.state_dict, *msg.constants):
        if not (r.fake or r.withheld):
            yield r.storage
    for m in msg.module_tensors:
        if not (m.tensor.fake or m.tensor.withheld):
            yield m.tensor.storage
    if nested:
        for lm in msg.lowered_modules:
            if not lm.original_withheld:
                yield from iter_digests(lm.original_program)


def has_withheld(msg: pb.Program) -> bool:
    """Whether the message withholds a tensor's data or a lowered module's original program,
    or a nested lowered program withholds a tensor's data."""
    if any(r.withheld for r in (*msg.state_dict, *msg.constants)):
        return True
    if any(m.tensor.withheld for m in msg.module_tensors):
        return True
    return any(
        lm.original_withheld or has_withheld(lm.original_program) for lm in msg.lowered_modules
    )
