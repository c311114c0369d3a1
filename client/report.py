"""What a remote partitioner delegated and why the rest stayed on the CPU, as plain Python.

Light on purpose (no torch): the command line reads Lower reports with it too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

#: ``RejectionSource`` values as the short names :class:`Rejection` uses.
SOURCES = {
    pb.REJECTION_SOURCE_UNSPECIFIED: "unspecified",
    pb.REJECTION_SOURCE_PARTITIONER: "partitioner",
    pb.REJECTION_SOURCE_BACKEND_LOG: "backend_log",
    pb.REJECTION_SOURCE_DERIVED: "derived",
}

#: How reports spell a getitem node's operator.
GETITEM = "_operator.getitem"


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A call_function node the hosted partitioner left outside every delegate.

    Attributes:
        name: the node's name (in ``graph``).
        target: its operator, e.g. "aten.cumsum.default".
        reason: why it was not delegated; never empty.
        source: where the reason comes from: "partitioner" (``WhyNoPartition`` or a
            ``WhyNoPartitionReporter``), "backend_log" (the backend's own skip message) or
            "derived" (the server's, when the partitioner said nothing about the node).
        graph: the graph module's path ("" for the root graph, e.g. "true_graph_0" for a
            ``torch.cond`` branch).
    """

    name: str
    target: str
    reason: str
    source: str
    graph: str = ""


@dataclasses.dataclass(frozen=True)
class Delegated:
    """What one backend took in one ``partition()`` call: its partitions (distinct tags) and
    the call_function nodes (getitem excluded) they hold."""

    partitions: int
    nodes: int


def rejections(messages: Iterable[pb.NodeRejection]) -> list[Rejection]:
    """``PartitionResponse.rejections`` as :class:`Rejection` s, in the response's order."""
    return [
        Rejection(
            name=r.node.name, target=r.target, reason=r.reason,
            source=SOURCES.get(r.source, "unspecified"), graph=r.node.graph,
        )
        for r in messages
    ]


def cpu_nodes(method: pb.MethodReport) -> list[dict[str, str]]:
    """The CPU call_function nodes of a Lower method report, in graph order, as
    ``{"name", "op", "reason"}`` (what ``--json`` prints as ``cpu_nodes``)."""
    return [
        {"name": n.name, "op": n.op, "reason": n.reason}
        for n in method.nodes
        if n.kind == "call_function" and not n.backend_id
    ]


def cpu_nodes_by_op(method: pb.MethodReport) -> list[tuple[str, list[tuple[str, str]]]]:
    """The CPU call_function nodes, getitems left out (as in ``cpu_ops``), grouped by
    operator (most nodes first, then by name): ``[(op, [(node name, reason), ...]), ...]``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for n in cpu_nodes(method):
        if n["op"] == GETITEM:
            continue
        groups.setdefault(n["op"], []).append((n["name"], n["reason"]))
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def with_cpu_nodes(report: pb.DelegationReport, as_dict: dict[str, Any]) -> dict[str, Any]:
    """``as_dict`` (``MessageToDict`` of ``report``) with ``cpu_nodes`` added to each method."""
    for method, entry in zip(report.methods, as_dict.get("methods", []), strict=False):
        entry["cpu_nodes"] = cpu_nodes(method)
    return as_dict


__all__ = [
    "GETITEM",
    "SOURCES",
    "Delegated",
    "Rejection",
    "cpu_nodes",
    "cpu_nodes_by_op",
    "rejections",
    "with_cpu_nodes",
]
