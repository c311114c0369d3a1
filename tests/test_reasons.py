"""Delegation reasons: why each node stayed on the CPU, on the wire, in the client and the CLI.

The expectations come from ExecuTorch itself: the DEBUG records ``WhyNoPartition`` logs and the
INFO skip messages Vulkan logs during a LOCAL run of the same partitioner on the same program.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from remote_partitioner.client.remote import RemotePartitioner
from remote_partitioner.client.report import Rejection


class _Mixed(torch.nn.Module):
    """A linear XNNPACK takes; cumsum and sort no XNNPACK config supports (derived reasons);
    an int64 add XNNPACK's config refuses with ``WhyNoPartition`` ("invalid dtype")."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.cumsum(self.fc(x), 0)
        return y.relu(), i + i, torch.sort(x)[0]


class _Other(torch.nn.Module):
    """A second model with other CPU ops (for keeping concurrent requests apart)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x * 3, 1)


def _mixed_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 4), torch.ones(4, 4, dtype=torch.int64)


def _edge(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> ExportedProgram:
    torch.manual_seed(0)
    return to_edge(torch.export.export(module.eval(), inputs, strict=True)).exported_program()


@contextmanager
def _log_records(name: str, level: int) -> Iterator[list[tuple[Any, str]]]:
    """ExecuTorch's own log records on logger ``name`` at ``level`` while the block runs, as
    (record.msg's node if it has one, the formatted message), read at emit time (XNNPACK
    reuses one WhyNoPartition object, so its node changes with the next call)."""
    records: list[tuple[Any, str]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((getattr(record.msg, "node", None), record.getMessage()))

    logger = logging.getLogger(name)
    handler = Collect(level)
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


_WHY = re.compile(r"^WhyNoPartition: Node (\S+) was not partitioned because (.*)\.$", re.S)


def _local_xnnpack_reasons(ep: ExportedProgram) -> tuple[dict[str, str], set[str], list[str]]:
    """A local XnnpackPartitioner on a copy of ``ep``: node name -> the reasons its DEBUG log
    gave (distinct, in order, "; "-joined), the tagged node names, the untagged call_function
    node names."""
    local = copy.deepcopy(ep)
    with _log_records("executorch.backends.xnnpack", logging.DEBUG) as records:
        result = XnnpackPartitioner().partition(local)
    said: dict[str, list[str]] = {}
    for node, message in records:
        match = _WHY.match(message)
        if match is None:
            continue
        assert node is None or node.name == match.group(1)
        reasons = said.setdefault(match.group(1), [])
        if match.group(2) not in reasons:
            reasons.append(match.group(2))
    nodes = list(result.tagged_exported_program.graph_module.graph.nodes)
    tagged = {n.name for n in nodes if "delegation_tag" in n.meta}
    untagged = [n.name for n in nodes if n.op == "call_function" and n.name not in tagged]
    return {k: "; ".join(v) for k, v in said.items()}, tagged, untagged


def _by_name(rejections: list[Rejection]) -> dict[str, Rejection]:
    out = {r.name: r for r in rejections}
    assert len(out) == len(rejections), rejections
    return out


def test_partition_reasons_match_executorch_log(server_address: str) -> None:
    ep = _edge(_Mixed(), _mixed_inputs())
    logged, tagged, untagged = _local_xnnpack_reasons(ep)
    assert logged, "the model must make XNNPACK call WhyNoPartition"

    remote = RemotePartitioner(server_address, "xnnpack", timeout=600)
    try:
        remote.partition(copy.deepcopy(ep))
        rejections = _by_name(remote.rejections)
        delegated = remote.delegated
    finally:
        remote.close()

    # Exactly the untagged call_function nodes, every one with a reason; tagged ones have none.
    assert list(rejections) == untagged
    assert not set(rejections) & tagged
    assert all(r.reason.strip() for r in rejections.values())
    for name, r in rejections.items():
        if name in logged:
            assert (r.reason, r.source) == (logged[name], "partitioner"), r
        else:
            assert r.source == "derived", r
    # What the partitioner did not say, the server derives from XNNPACK's config table.
    assert rejections["aten_cumsum_default"].reason == (
        "no XNNPACK config supports aten.cumsum.default"
    )
    assert rejections["aten_sort_default"].target == "aten.sort.default"
    assert rejections["aten_add_tensor"].reason == "invalid dtype"
    assert rejections["aten_add_tensor"].source == "partitioner"
    getitem = next(r for r in rejections.values() if r.target == "_operator.getitem")
    assert getitem.source == "derived" and "aten_sort_default" in getitem.reason
    # One partition holding the linear.
    assert set(delegated) == {"XnnpackBackend"}
    assert delegated["XnnpackBackend"].partitions >= 1
    assert delegated["XnnpackBackend"].nodes >= 1


def test_capture_keeps_concurrent_calls_apart() -> None:
    """In one process, threads capturing around different partitions see only their nodes."""
    from remote_partitioner.server import reasons

    programs = [_edge(_Mixed(), _mixed_inputs()), _edge(_Other(), (torch.randn(3, 3),))]
    start = threading.Barrier(4)

    def run(k: int) -> set[str]:
        ep = copy.deepcopy(programs[k % 2])
        partitioner = XnnpackPartitioner()
        start.wait(timeout=120)
        with reasons.capture() as said:
            result = partitioner.partition(ep)
        own = set(ep.graph_module.graph.nodes)
        assert set(said.said) <= own
        return {r.name for r in reasons.rejections(partitioner, result.tagged_exported_program,
                                                    said)}

    with ThreadPoolExecutor(4) as pool:
        names = list(pool.map(run, range(4)))
    assert names[0] == names[2] and names[1] == names[3]
    assert "aten_add_tensor" in names[0] and "aten_argmax_default" in names[1]


@pytest.mark.slow
def test_concurrent_partition_calls_keep_reasons_apart(
    uncached_server_process: tuple[subprocess.Popen[str], str],
) -> None:
    target = uncached_server_process[1]
    programs = [_edge(_Mixed(), _mixed_inputs()), _edge(_Other(), (torch.randn(3, 3),))]

    def run(k: int) -> dict[str, str]:
        remote = RemotePartitioner(target, "xnnpack", timeout=600)
        try:
            remote.partition(copy.deepcopy(programs[k % 2]))
            return {r.name: r.reason for r in remote.rejections}
        finally:
            remote.close()

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(run, range(6)))
    for k, answer in enumerate(answers):
        assert answer == answers[k % 2]
    assert "aten_cumsum_default" in answers[0] and "aten_argmax_default" not in answers[0]
    assert "aten_argmax_default" in answers[1] and "aten_cumsum_default" not in answers[1]
    assert answers[1]["aten_argmax_default"] == "no XNNPACK config supports aten.argmax.default"


@pytest.mark.slow
def test_vulkan_skip_messages_arrive_as_backend_log(server_address: str) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    ep = _edge(_Mixed(), _mixed_inputs())
    with _log_records("", logging.INFO) as records:  # Vulkan logs on the root logger
        VulkanPartitioner().partition(copy.deepcopy(ep))
    skips = [m for _, m in records if m.startswith("[Vulkan Partitioner] Due to [")]
    assert skips

    remote = RemotePartitioner(server_address, "vulkan", timeout=600)
    try:
        remote.partition(copy.deepcopy(ep))
        rejections = remote.rejections
    finally:
        remote.close()
    from_log = [r for r in rejections if r.source == "backend_log"]
    assert from_log
    for r in from_log:  # each is the reason of a skip message Vulkan logged for that op
        assert any(
            m.startswith(f"[Vulkan Partitioner] Due to [{r.reason}], skipping")
            and f"= {r.target}(" in m
            for m in skips
        ), (r, skips)
    assert all(r.reason for r in rejections)


# ---------------------------------------------------------------------- Lower and the CLI


@pytest.fixture(scope="module")
def archive() -> bytes:
    torch.manual_seed(0)
    ep = torch.export.export(_Mixed().eval(), _mixed_inputs(), strict=True)
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    return buffer.getvalue()


class _Watching(XnnpackPartitioner):
    """The local XnnpackPartitioner, recording the call_function nodes of the program it
    partitioned and which of them it tagged."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, bool] = {}

    def partition(self, exported_program: ExportedProgram) -> Any:
        result = super().partition(exported_program)
        self.seen = {
            n.name: "delegation_tag" in n.meta
            for n in result.tagged_exported_program.graph_module.graph.nodes
            if n.op == "call_function"
        }
        return result


def _local_lowering(archive: bytes) -> tuple[bytes, dict[str, bool]]:
    ep = torch.export.load(io.BytesIO(archive))  # trusted here: the test wrote it
    watching: Partitioner = _Watching()
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[watching]).to_executorch().buffer)
    assert isinstance(watching, _Watching)
    return pte, watching.seen


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.mark.slow
def test_cli_lower_json_reports_every_node_and_cpu_reasons(
    server_address: str, archive: bytes, tmp_path: Path
) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(archive)
    out = tmp_path / "model.pte"
    done = _cli("lower", str(model), "-o", str(out), "--partitioner", "xnnpack",
                "--target", server_address, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    local_pte, seen = _local_lowering(archive)
    assert out.read_bytes() == local_pte  # reasons change nothing in the lowering

    (method,) = json.loads(done.stdout)["methods"]
    nodes = {n["name"]: n for n in method["nodes"]}
    assert len(nodes) == len(method["nodes"])
    # The report's call_function nodes are the partitioned program's, each where it went.
    calls = {name: n for name, n in nodes.items() if n["kind"] == "call_function"}
    assert set(calls) == set(seen)
    for name, was_tagged in seen.items():
        assert bool(calls[name].get("backend_id")) == was_tagged, calls[name]
        if was_tagged:
            assert calls[name]["partition"] and not calls[name].get("reason")
        else:
            assert calls[name]["reason"].strip(), calls[name]
    partitions = {p["id"]: p for p in method["partitions"]}
    assert {n["partition"] for n in calls.values() if n.get("partition")} == set(partitions)
    for pid, p in partitions.items():
        inside = [n for n in calls.values()
                  if n.get("partition") == pid and n["op"] != "_operator.getitem"]
        assert int(p["nodes"]) == len(inside)
    # Inputs name nodes of the report; the graph reads the user inputs and ends in an output.
    for n in nodes.values():
        assert set(n.get("inputs", [])) <= set(nodes), n
    assert {"x", "i"} <= {n for n, v in nodes.items() if v["kind"] == "placeholder"}
    assert [v["kind"] for v in nodes.values()].count("output") == 1
    linear = next(n for n in calls.values() if n["op"] == "aten.linear.default")
    assert linear["shapes"] == "f32[4, 4]"
    assert [s.get("path", "") for s in linear["module_stack"]][-1] == "fc"
    # cpu_nodes: name, op and reason of each CPU call_function node.
    cpu = {c["name"]: c for c in method["cpu_nodes"]}
    assert set(cpu) == {name for name, tagged in seen.items() if not tagged}
    assert cpu["aten_cumsum_default"] == {
        "name": "aten_cumsum_default", "op": "aten.cumsum.default",
        "reason": "no XNNPACK config supports aten.cumsum.default",
    }
    assert cpu["aten_add_tensor"]["reason"] == "invalid dtype"
    assert calls["aten_add_tensor"]["reason_source"] == "REJECTION_SOURCE_PARTITIONER"
    assert calls["aten_cumsum_default"]["reason_source"] == "REJECTION_SOURCE_DERIVED"

    done = _cli("partition", str(model), "--partitioner", "xnnpack", "--target", server_address)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "aten.cumsum.default: no XNNPACK config supports aten.cumsum.default" in done.stdout


def test_report_nodes_unit() -> None:
    """graph_report on a local lowering: each delegate is expanded, getitems of delegate calls
    read as the inner nodes, every CPU call_function node gets the reason function's answer."""
    from remote_partitioner.server import lowering

    ep = torch.export.export(_Mixed().eval(), _mixed_inputs(), strict=True)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    nodes, partitions = lowering.graph_report(
        edge.exported_program(), lambda n: (f"why {n.name}", 3)
    )
    names = [n.name for n in nodes]
    assert len(names) == len(set(names))
    assert not any("executorch_call_delegate" in n.op for n in nodes)
    assert not any(n.name.startswith("lowered_module") for n in nodes)
    for n in nodes:
        if n.kind == "call_function" and not n.backend_id:
            assert n.reason == f"why {n.name}"
        else:
            assert not n.reason
    assert partitions and all(p.backend_id == "XnnpackBackend" for p in partitions)


class _Cumsum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x * 2, 0)


class _Sort(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x + 1)[0]


@pytest.mark.slow
def test_lowering_reasons_per_method_and_partitioner() -> None:
    """Two methods, two partitioners (XNNPACK with only its add config, then all of XNNPACK):
    each method's CPU nodes get the reasons of its own partition() calls, each prefixed with
    the backend; a node the second partitioner took has none."""
    from executorch.backends.xnnpack.partition.config.generic_node_configs import AddConfig

    from remote_partitioner.server import lowering

    programs = {
        "a": torch.export.export(_Cumsum(), (torch.randn(3, 3),), strict=True),
        "b": torch.export.export(_Sort(), (torch.randn(3, 3),), strict=True),
    }
    methods, pte = lowering.lower(
        programs, [XnnpackPartitioner(configs=[AddConfig]), XnnpackPartitioner()],
        report_only=True,
    )
    assert pte is None
    calls = {
        m.method: {n.name: n for n in m.nodes if n.kind == "call_function"} for m in methods
    }
    derived = "XnnpackBackend: no XNNPACK config supports aten.{0}.default"
    assert calls["a"]["aten_cumsum_default"].reason == "; ".join([derived.format("cumsum")] * 2)
    assert calls["b"]["aten_sort_default"].reason == "; ".join([derived.format("sort")] * 2)
    assert "aten_sort_default" not in calls["a"] and "aten_cumsum_default" not in calls["b"]
    mul = calls["a"]["aten_mul_tensor"]  # refused by the first, taken by the second
    assert mul.backend_id == "XnnpackBackend" and not mul.reason
    add = calls["b"]["aten_add_tensor"]  # taken by the first
    assert add.backend_id == "XnnpackBackend" and not add.reason
    for m in methods:
        assert {p.id for p in m.partitions} == {
            n.partition for n in m.nodes if n.partition
        }


class _ArgmaxAll(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.argmax(x, None), x.sin() + 1


@pytest.mark.slow
def test_coreml_skip_messages_arrive_as_backend_log(server_address: str) -> None:
    """Core ML logs each skip message once per partitioner; the capture still ties each to
    its node, and the reason is made of the messages Core ML logged locally."""
    from executorch.backends.apple.coreml.partition.coreml_partitioner import CoreMLPartitioner

    ep = _edge(_ArgmaxAll(), (torch.randn(4, 4),))
    logger_name = "executorch.backends.apple.coreml.partition.coreml_partitioner"
    with _log_records(logger_name, logging.INFO) as records:
        CoreMLPartitioner().partition(copy.deepcopy(ep))
    logged = {m for _, m in records}

    remote = RemotePartitioner(server_address, "coreml", timeout=600)
    try:
        remote.partition(copy.deepcopy(ep))
        rejections = _by_name(remote.rejections)
    finally:
        remote.close()
    argmax = rejections["aten_argmax_default"]
    assert argmax.source == "backend_log"
    parts = argmax.reason.split("; ")
    assert parts and set(parts) <= logged, (parts, logged)
    assert any("argmax" in p for p in parts)
