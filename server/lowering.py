"""Lowers whole programs on the server (the ``Lower`` RPC) and reports what was delegated."""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import torch.fx
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server import reasons
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
    #: the method's graph as partitioned (see :func:`graph_report`)
    nodes: list[pb.ReportNode] = dataclasses.field(default_factory=list)
    #: its partitions, in graph order
    partitions: list[pb.ReportPartition] = dataclasses.field(default_factory=list)


def _no_reason(node: torch.fx.Node) -> tuple[str, int]:
    return f"no partitioner took {reasons.target_label(node)}", reasons.DERIVED


def _op_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [
        n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem
    ]


_DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8",
}


def _shapes(value: object) -> str:
    """``meta["val"]`` as text: "f32[1, 3, 224, 224]", several outputs joined with ", "."""
    if isinstance(value, torch.Tensor):
        dtype = _DTYPES.get(value.dtype, str(value.dtype).removeprefix("torch."))
        return f"{dtype}[{', '.join(str(d) for d in value.shape)}]"
    if isinstance(value, (list, tuple)):
        return ", ".join(t for t in (_shapes(v) for v in value) if t)
    return ""


def _module_stack(node: torch.fx.Node) -> list[pb.ModuleScope]:
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for entry in stack.values():
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            continue
        path, kind = entry
        if isinstance(kind, type):
            kind = f"{kind.__module__}.{kind.__qualname__}"
        out.append(pb.ModuleScope(path=str(path), type=str(kind)))
    return out


def _is_delegate_call(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and "executorch_call_delegate" in str(node.target)
        and bool(node.args)
        and isinstance(node.args[0], torch.fx.Node)
    )


class _GraphReport:
    """Builds the report nodes of one method: see :func:`graph_report`."""

    def __init__(self, cpu_reason: Callable[[torch.fx.Node], tuple[str, int]]) -> None:
        self.cpu_reason = cpu_reason
        self.nodes: list[pb.ReportNode] = []
        self.partitions: list[pb.ReportPartition] = []
        #: node object -> the report name its value goes by
        self.alias: dict[torch.fx.Node, str] = {}
        self.names: set[str] = set()

    def _name(self, node: torch.fx.Node) -> str:
        name = node.name
        i = 1
        while name in self.names:
            name, i = f"{node.name}_{i}", i + 1
        self.names.add(name)
        self.alias[node] = name
        return name

    def _inputs(self, node: torch.fx.Node) -> list[str]:
        out: list[str] = []

        def visit(arg: torch.fx.Node) -> torch.fx.Node:
            name = self.alias.get(arg)
            if name is not None and name not in out:
                out.append(name)
            return arg

        torch.fx.node.map_arg((node.args, node.kwargs), visit)
        return out

    def add(self, node: torch.fx.Node, backend: str = "", partition: str = "") -> None:
        kind = node.op
        op = reasons.target_label(node) if kind == "call_function" else kind
        entry = pb.ReportNode(
            name=self._name(node), op=op, kind=kind, inputs=self._inputs(node),
            backend_id=backend, partition=partition, shapes=_shapes(node.meta.get("val")),
            stack_trace=str(node.meta.get("stack_trace") or ""),
            module_stack=_module_stack(node),
        )
        if kind == "call_function" and not backend:
            entry.reason, source = self.cpu_reason(node)
            entry.reason_source = source  # type: ignore[assignment]
        self.nodes.append(entry)

    def delegate(self, gm: torch.fx.GraphModule, call: torch.fx.Node, pid: str) -> None:
        """The nodes of the lowered module ``call`` runs, in place of ``call``."""
        from torch.export.graph_signature import InputKind

        module_node = call.args[0]
        assert isinstance(module_node, torch.fx.Node)
        lowered = getattr(gm, str(module_node.target))
        inner: ExportedProgram = lowered.original_module
        backend = str(lowered.backend_id)
        user_inputs = [
            s.arg.name for s in inner.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT and hasattr(s.arg, "name")
        ]
        outer_args = list(call.args[1:])
        by_input = dict(zip(user_inputs, outer_args, strict=False))
        count = 0
        for path, sub in codec.graph_modules(inner.graph_module):
            for node in sub.graph.nodes:
                if path == "" and node.op == "placeholder" and node.name in by_input:
                    outer = by_input[node.name]
                    if isinstance(outer, torch.fx.Node) and outer in self.alias:
                        self.alias[node] = self.alias[outer]
                        continue
                if node.op == "output":
                    if path == "":
                        self._delegate_outputs(call, node)
                    continue
                if path and node.op == "placeholder":
                    continue
                if node.op == "call_function" and node.target is not operator.getitem:
                    count += 1
                if path == "":
                    self.add(node, backend, pid)
        self.partitions.append(pb.ReportPartition(id=pid, backend_id=backend, nodes=count))

    def _delegate_outputs(self, call: torch.fx.Node, output: torch.fx.Node) -> None:
        """The getitems of ``call`` go by the names of the inner nodes they return."""
        results = output.args[0] if output.args else ()
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        for user in call.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                i = user.args[1]
                inner = results[i] if 0 <= i < len(results) else None
                if isinstance(inner, torch.fx.Node) and inner in self.alias:
                    self.alias[user] = self.alias[inner]


def graph_report(
    ep: ExportedProgram, cpu_reason: Callable[[torch.fx.Node], tuple[str, int]]
) -> tuple[list[pb.ReportNode], list[pb.ReportPartition]]:
    """The nodes of a lowered method's top-level graph as partitioned, and its partitions.

    Each ``executorch_call_delegate`` is replaced by the nodes of its lowered module's
    original program (the placeholders of its user inputs and its output node excepted: the
    nodes reading them read the outer nodes instead), marked with the backend and partition
    (the lowered module's attribute name); the getitems of a delegate call are replaced by
    the inner nodes they return, as are the ``get_attr`` nodes of lowered modules. Every other
    node is a CPU node; a CPU call_function node gets ``cpu_reason(node)`` (reason, source).
    Nodes inside control-flow branches are not listed (their ``cond`` node is).
    """
    out = _GraphReport(cpu_reason)
    gm = ep.graph_module
    lowered_attrs = {
        n for n in gm.graph.nodes
        if n.op == "get_attr" and type(getattr(gm, str(n.target), None)).__name__
        == "LoweredBackendModule"
    }
    for node in gm.graph.nodes:
        if node in lowered_attrs or node in out.alias:
            continue
        if _is_delegate_call(node):
            module_node = node.args[0]
            assert isinstance(module_node, torch.fx.Node)
            out.delegate(gm, node, str(module_node.target))
            continue
        out.add(node)
    return out.nodes, out.partitions


def _cpu_reasons(
    calls: list[reasons.PartitionCall], methods: list[str], partitioners: int
) -> dict[str, Callable[[torch.fx.Node], tuple[str, int]]]:
    """Per method: the function giving a CPU node its reason, from the ``partition()`` calls
    of the lowering (``to_edge_transform_and_lower`` calls partitioner i on every method, in
    method order, before partitioner i + 1). With several partitioners each one's reason is
    prefixed with its backend; a node no call saw gets a derived reason."""
    by_method: dict[str, list[reasons.PartitionCall]] = {m: [] for m in methods}
    if methods and len(calls) == len(methods) * partitioners:
        for k, call in enumerate(calls):
            by_method[methods[k % len(methods)]].append(call)

    def for_method(method_calls: list[reasons.PartitionCall]) -> Callable[
        [torch.fx.Node], tuple[str, int]
    ]:
        def reason(node: torch.fx.Node) -> tuple[str, int]:
            said = []
            for call in method_calls:
                r = call.rejected.get(("", node.name))
                if r is None:
                    continue
                backend = reasons.backend_id(call.partitioner) or type(call.partitioner).__name__
                said.append((f"{backend}: {r.reason}" if partitioners > 1 else r.reason,
                             r.source))
            if said:
                return "; ".join(text for text, _ in said), said[0][1]
            return (
                f"not offered to a partitioner ({reasons.target_label(node)} was not in the "
                "program they partitioned)", reasons.DERIVED,
            )

        return reason

    return {m: for_method(c) for m, c in by_method.items()}


def report(
    edge: EdgeProgramManager,
    cpu_reasons: Mapping[str, Callable[[torch.fx.Node], tuple[str, int]]] | None = None,
) -> list[MethodReport]:
    """The delegation report of a lowered program, one entry per method sorted by name.

    A node inside a delegate counts for its backend (over the lowered module's original
    program); any other operator node, control-flow branches included, counts as left on the
    CPU. ``total_nodes`` is the sum of both. ``nodes`` and ``partitions`` come from
    :func:`graph_report`, with ``cpu_reasons[method]`` giving CPU nodes their reasons.
    """
    out = []
    for method in sorted(edge.methods):
        ep = edge.exported_program(method)
        entry = MethodReport(method)
        cpu_reason = (cpu_reasons or {}).get(method) or _no_reason
        entry.nodes, entry.partitions = graph_report(ep, cpu_reason)
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
        with reasons.recording(list(partitioners)) as calls:
            edge = to_edge_transform_and_lower(
                dict(programs),
                partitioner=list(partitioners),
                compile_config=EdgeCompileConfig(_check_ir_validity=check_ir_validity),
            )
        methods = report(edge, _cpu_reasons(calls, list(programs), len(partitioners)))
        pte = None if report_only else bytes(edge.to_executorch().buffer)
    except Exception as e:
        raise PartitionerRaised(e) from e
    return methods, pte
