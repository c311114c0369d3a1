"""Delegation reports (as JSON) from REAL local lowerings, for the report page's tests and bench.

The shape is the one ``json_format.MessageToDict(DelegationReport,
preserving_proto_field_name=True)`` gives with the ``Lower`` RPC's per-node data: per method
``nodes`` (name, op, kind, inputs, shapes, backend_id/partition when delegated, reason and
reason_source when not, stack_trace, module_stack), ``partitions`` and ``cpu_nodes``; default
values are omitted as MessageToDict omits them (int64 counts stay ints here).

This is the ONE place the page tests get their input from: :func:`report_for` lowers the model
with ExecuTorch's ``XnnpackPartitioner`` in this process, records the program the partitioner
tagged (its real tags, and the reasons it logged through ``WhyNoPartition``) and builds the
report, without a server (so the llama2 page test needs none, and can skip the minutes of
XNNPACK preprocess). :func:`two_partitioner_report` is the report the server's own lowering
code (``server/lowering.py``, in this process) makes of two partitioners in a row. The server's
report is tested end to end in tests/test_report_page.py::test_lower_writes_the_report_page.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from typing import Any

import torch


class _WhyNoPartitionLog(logging.Handler):
    """Keeps the first ``WhyNoPartition`` reason logged for each node name."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        why = record.msg  # a WhyNoPartition object, mutated by its next call: read it now
        node, reason = getattr(why, "node", None), getattr(why, "reason", None)
        if node is not None and reason:
            self.reasons.setdefault(str(node.name), str(reason))


def _shapes(node: torch.fx.Node) -> str:
    from torch.utils._pytree import tree_leaves

    short = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
             torch.int64: "i64", torch.int32: "i32", torch.bool: "bool", torch.int8: "i8",
             torch.uint8: "u8"}
    parts = []
    for v in tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            dtype = short.get(v.dtype, str(v.dtype).removeprefix("torch."))
            parts.append(f"{dtype}[{', '.join(str(d) for d in v.shape)}]")
    return ", ".join(parts)


def _op(node: torch.fx.Node) -> str:
    if node.op != "call_function":
        return node.op
    if isinstance(node.target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        return str(node.target)  # "aten.linear.default"
    return str(getattr(node.target, "__name__", node.target))  # "getitem"


def _record(
    ep: Any, partition_tags: dict[str, Any], reasons: dict[str, str]
) -> dict[str, Any]:
    """One method's report from the program the partitioner tagged."""
    nodes: list[dict[str, Any]] = []
    partitions: Counter[str] = Counter()
    backend_of_tag = {tag: spec.backend_id for tag, spec in partition_tags.items()}
    cpu_ops: Counter[str] = Counter()
    delegated: dict[str, Counter[str]] = {}
    cpu_nodes = []
    total = 0
    for n in ep.graph_module.graph.nodes:
        op = _op(n)
        entry: dict[str, Any] = {"name": n.name, "op": op, "kind": n.op}
        inputs = [a.name for a in n.all_input_nodes]
        if inputs:
            entry["inputs"] = inputs
        shapes = _shapes(n)
        if shapes:
            entry["shapes"] = shapes
        tag = n.meta.get("delegation_tag")
        operator = n.op == "call_function" and "getitem" not in op
        if tag:
            entry["backend_id"] = backend_of_tag[tag]
            entry["partition"] = tag
            if operator:
                partitions[tag] += 1
                delegated.setdefault(backend_of_tag[tag], Counter())[tag] += 1
        elif operator:
            entry["reason"] = reasons.get(
                n.name, f"no partitioner claimed {op} (none of its checks accepted the node)"
            )
            entry["reason_source"] = (
                "REJECTION_SOURCE_PARTITIONER" if n.name in reasons
                else "REJECTION_SOURCE_DERIVED"
            )
            cpu_ops[op] += 1
            cpu_nodes.append({"name": n.name, "op": op, "reason": entry["reason"]})
        total += operator
        if n.meta.get("stack_trace"):
            entry["stack_trace"] = n.meta["stack_trace"]
        stack = n.meta.get("nn_module_stack") or {}
        if stack:
            entry["module_stack"] = []
            for path, type_ in stack.values():
                t = type_ if isinstance(type_, str) else f"{type_.__module__}.{type_.__qualname__}"
                entry["module_stack"].append({"path": path, "type": t})
        nodes.append(entry)
    method: dict[str, Any] = {
        "total_nodes": total,
        "delegated": [
            {"backend_id": b, "partitions": len(tags), "nodes": sum(tags.values())}
            for b, tags in sorted(delegated.items())
        ],
        "cpu_ops": [{"op": o, "count": c} for o, c in cpu_ops.most_common()],
        "nodes": nodes,
        "partitions": [
            {"id": t, "backend_id": backend_of_tag[t], "nodes": c}
            for t, c in sorted(partitions.items())
        ],
        "cpu_nodes": cpu_nodes,
    }
    return {k: v for k, v in method.items() if v}


class _Partitioned(Exception):
    """Raised out of ``partition()`` once the tags are recorded, to skip the backend's
    preprocess (minutes for a deep model) that the report does not depend on."""


def report_for(
    model: torch.nn.Module, inputs: tuple[Any, ...], *, preprocess: bool = True
) -> dict[str, Any]:
    """Export ``model`` at ``inputs``, lower it with the XNNPACK partitioner and return the
    delegation report of method ``forward`` in the wire's JSON shape. ``preprocess=False``
    stops the lowering right after the partitioner tagged the program."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.partitioner import Partitioner, PartitionResult

    class Recording(Partitioner):
        """XnnpackPartitioner, recording the program it tagged (a real run, not a replay)."""

        def __init__(self) -> None:
            self.inner = XnnpackPartitioner()
            super().__init__(self.inner.delegation_spec)
            self.method: dict[str, Any] = {}
            self.log = _WhyNoPartitionLog()

        def ops_to_not_decompose(self, ep: Any) -> Any:
            return self.inner.ops_to_not_decompose(ep)

        def partition(self, ep: Any) -> PartitionResult:
            root = logging.getLogger()
            old = root.level
            root.addHandler(self.log)
            root.setLevel(logging.DEBUG)
            try:
                result = self.inner.partition(ep)
            finally:
                root.removeHandler(self.log)
                root.setLevel(old)
            self.method = _record(result.tagged_exported_program, result.partition_tags,
                                  self.log.reasons)
            if not preprocess:
                raise _Partitioned
            return result

    recording = Recording()
    ep = torch.export.export(model.eval(), inputs, strict=False)
    with contextlib.suppress(_Partitioned):
        to_edge_transform_and_lower(ep, partitioner=[recording])
    return {"methods": [{"method": "forward", **recording.method}]}


class SmallModel(torch.nn.Module):
    """Two linears XNNPACK takes, with a cumsum and a sort between them that it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        h = torch.cumsum(h, dim=1)
        h = torch.sort(h, dim=1).values
        return self.head(h).softmax(dim=-1)


def small_report() -> dict[str, Any]:
    """The report of :class:`SmallModel` (a few dozen nodes, two partitions, CPU nodes)."""
    torch.manual_seed(0)
    return report_for(SmallModel(), (torch.randn(2, 8),))


def two_partitioner_report() -> dict[str, Any]:
    """The report of :class:`SmallModel` lowered by two partitioners in a row, as the server
    makes it (``server.lowering.lower``, then the message MessageToDict turns into the wire's
    JSON): XNNPACK with only its addmm config (it takes the linears, and the relu it fuses),
    then Vulkan (the softmax): two backends, the input ``x`` feeding a node two modules deep."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from google.protobuf import json_format

    from remote_partitioner.server import lowering
    from remote_partitioner.server.lower_call import report_message

    torch.manual_seed(0)
    ep = torch.export.export(SmallModel().eval(), (torch.randn(2, 8),), strict=False)
    methods, _ = lowering.lower(
        {"forward": ep}, [XnnpackPartitioner(configs=[AddmmConfig]), VulkanPartitioner()],
        report_only=True,
    )
    report: dict[str, Any] = json_format.MessageToDict(
        report_message(methods), preserving_proto_field_name=True
    )
    return report


#: The llama2 example at Llama 2 7B's depth (32 layers) with small widths: its default
#: configuration has one layer (136 nodes); this one has about 3,800.
LLAMA2_PARAMS = {"dim": 64, "n_layers": 32, "n_heads": 4, "vocab_size": 256}


def llama2_report(n_layers: int = LLAMA2_PARAMS["n_layers"]) -> dict[str, Any]:
    """The report of ExecuTorch's ``llama2`` example model at :data:`LLAMA2_PARAMS`, with
    ``n_layers`` transformer blocks (about 118 nodes each; at 32, partitioning takes most of
    three minutes on 2 cores)."""
    import json
    import tempfile

    from executorch.examples.models.llama.model import Llama2Model
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    with tempfile.NamedTemporaryFile("w", suffix=".json") as params:
        json.dump({**LLAMA2_PARAMS, "n_layers": n_layers}, params)
        params.flush()
        config = LlmConfig()
        config.base.params = params.name
        eager = Llama2Model(config)
    torch.manual_seed(0)
    return report_for(eager.get_eager_model(), eager.get_example_inputs(), preprocess=False)


if __name__ == "__main__":  # python tests/report_inputs.py small|two|llama2 OUT.json
    import json
    import sys

    which, out = sys.argv[1], sys.argv[2]
    make = {"small": small_report, "two": two_partitioner_report, "llama2": llama2_report}
    report = make[which]()
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
