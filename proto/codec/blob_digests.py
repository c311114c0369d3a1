"""The blob digests a ``Program`` message names (to ask which are missing, to fetch them)."""

from __future__ import annotations

from collections.abc import Iterator

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["graph_digests", "has_withheld", "iter_digests", "nested_programs"]


def nested_programs(msg: pb.Program) -> Iterator[pb.Program]:
    """The original programs of a Program message's lowered modules that the message carries
    (not those withheld: ``LoweredModule.original_withheld``), one level deep."""
    return (lm.original_program for lm in msg.lowered_modules if not lm.original_withheld)


def graph_digests(msg: pb.Program) -> Iterator[pb.Digest]:
    """The graph (JSON) blob digests of a Program message and its nested lowered programs."""
    yield msg.graph
    for nested in nested_programs(msg):
        yield from graph_digests(nested)


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
        for program in nested_programs(msg):
            yield from iter_digests(program)


def has_withheld(msg: pb.Program) -> bool:
    """Whether the message withholds a tensor's data or a lowered module's original program,
    or a nested lowered program withholds a tensor's data."""
    if any(r.withheld for r in (*msg.state_dict, *msg.constants)):
        return True
    if any(m.tensor.withheld for m in msg.module_tensors):
        return True
    if any(lm.original_withheld for lm in msg.lowered_modules):
        return True
    return any(has_withheld(nested) for nested in nested_programs(msg))
