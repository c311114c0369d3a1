"""Lowers whole programs on the server (the ``Lower`` RPC) and reports what was delegated."""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Mapping, Sequence

import torch.fx
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.server.hooks import PartitionerRaised


@dataclasses.dataclass
class MethodReport:
    """What was delegated in one method."""

    method: str
    total_nodes: int = 0
    #: backend id -> (partitions, nodes)
    delegated: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    #: operator -> count, for the operators left on the CPU
    cpu_ops: Counter[str] = dataclasses.field(default_factory=Counter)


def _op_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [
        n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem
    ]


def report(edge: EdgeProgramManager) -> list[MethodReport]:
    """The delegation report of a lowered program, one entry per method sorted by name.

    A node inside a delegate counts for its backend (over the lowered module's original
    program); any other operator node, control-flow branches included, counts as left on the
    CPU. ``total_nodes`` is the sum of both.
    """
    out = []
    for method in sorted(edge.methods):
        ep = edge.exported_program(method)
        entry = MethodReport(method)
        for _, gm in codec.graph_modules(ep.graph_module):
            for node in _op_nodes(gm.graph):
                module_arg = node.args[0] if node.args else None
                if "executorch_call_delegate" in str(node.target) and isinstance(
                    module_arg, torch.fx.Node
                ):
                    lowered = getattr(gm, str(module_arg.target))
                    inner = sum(
                        len(_op_nodes(g.graph))
                        for _, g in codec.graph_modules(lowered.original_module.graph_module)
                    )
                    partitions, nodes = entry.delegated.get(lowered.backend_id, (0, 0))
                    entry.delegated[lowered.backend_id] = (partitions + 1, nodes + inner)
                elif node.target is not torch.ops.higher_order.cond:
                    name = codec.target_name(node.target).removeprefix("edge.")
                    entry.cpu_ops[name] += 1
        entry.total_nodes = sum(entry.cpu_ops.values()) + sum(
            n for _, n in entry.delegated.values()
        )
        out.append(entry)
    return out


def lower(
    programs: Mapping[str, ExportedProgram],
    partitioners: Sequence[Partitioner],
    *,
    check_ir_validity: bool = True,
    report_only: bool = False,
) -> tuple[list[MethodReport], bytes | None]:
    """``to_edge_transform_and_lower(programs, partitioner=partitioners)``, then (unless
    ``report_only``) ``to_executorch()``; returns the report and the ``.pte`` bytes.

    A program named "model" alone (what ``torch.export.save`` writes) becomes "forward".

    Raises:
        PartitionerRaised: lowering raised; carries the exception.
    """
    if set(programs) == {"model"}:
        programs = {"forward": programs["model"]}
    try:
        edge = to_edge_transform_and_lower(
            dict(programs),
            partitioner=list(partitioners),
            compile_config=EdgeCompileConfig(_check_ir_validity=check_ir_validity),
        )
        methods = report(edge)
        pte = None if report_only else bytes(edge.to_executorch().buffer)
    except Exception as e:
        raise PartitionerRaised(e) from e
    return methods, pte
