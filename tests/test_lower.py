"""The Lower RPC and the client command line: archive in, report and byte-identical .pte out."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

from remote_partitioner.client.errors import PartitionerNotFoundError, RemotePartitionerError
from remote_partitioner.client.lower import LowerClient, partitioner_ref


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # cumsum is not delegated to XNNPACK: something stays on the CPU.
        return torch.cumsum(self.fc2(torch.relu(self.fc1(x))), dim=1)


@pytest.fixture(scope="module")
def archive() -> bytes:
    torch.manual_seed(0)
    ep = torch.export.export(_Net().eval(), (torch.randn(2, 8),), strict=True)
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    return buffer.getvalue()


def _local_pte(archive: bytes) -> bytes:
    ep = torch.export.load(io.BytesIO(archive))  # trusted here: the test wrote it
    return bytes(
        to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    )


@pytest.mark.slow
def test_lower_gives_the_local_pte_and_a_report(server_address: str, archive: bytes) -> None:
    with LowerClient(server_address, timeout=600) as client:
        result = client.lower(archive, [partitioner_ref("xnnpack")])
    assert result.pte == _local_pte(archive)
    (method,) = result.report.methods
    assert method.method == "forward"
    (xnn,) = method.delegated
    assert xnn.backend_id == "XnnpackBackend" and xnn.partitions >= 1 and xnn.nodes >= 3
    cpu = {op.op: op.count for op in method.cpu_ops}
    assert cpu.get("aten.cumsum.default") == 1, cpu
    assert method.total_nodes == xnn.nodes + sum(cpu.values())


@pytest.mark.slow  # a lowering on the server (> 5 s)
def test_report_only_sends_no_pte(server_address: str, archive: bytes) -> None:
    with LowerClient(server_address, timeout=600) as client:
        result = client.lower(archive, [partitioner_ref("xnnpack")], report_only=True)
    assert result.pte is None
    assert result.report.methods[0].delegated


def test_lower_errors(server_address: str, archive: bytes) -> None:
    with LowerClient(server_address, timeout=600) as client:
        with pytest.raises(PartitionerNotFoundError, match="xnnpack"):
            client.lower(archive, [partitioner_ref("nope")])
        with pytest.raises(RemotePartitionerError) as e:
            client.lower(archive, [])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(RemotePartitionerError) as e:
            client.lower(b"not a zip archive", [partitioner_ref("xnnpack")])
        assert e.value.reason == "INVALID_PROGRAM"
        assert client.list_partitioners().partitioners  # still serving


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.mark.slow
def test_cli_lower_partition_list(server_address: str, archive: bytes, tmp_path: Path) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(archive)
    out = tmp_path / "model.pte"
    done = _cli("lower", str(model), "-o", str(out), "--partitioner", "xnnpack",
                "--target", server_address)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes() == _local_pte(archive)
    assert "XnnpackBackend" in done.stdout
    done = _cli("partition", str(model), "--partitioner", "xnnpack", "--spec",
                "per_op_mode=false", "--target", server_address, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["methods"][0]["delegated"][0]["backend_id"] == "XnnpackBackend"
    done = _cli("list", "--target", server_address, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    names = {p["name"] for p in json.loads(done.stdout)["partitioners"]}
    assert {"xnnpack", "coreml", "vulkan"} <= names


def test_cli_exit_codes(server_address: str, archive: bytes, tmp_path: Path) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(archive)
    usage = _cli("lower", str(tmp_path / "missing.pt2"), "-o", "x.pte", "--partitioner",
                 "xnnpack", "--target", server_address)
    assert usage.returncode == 2 and "cannot read" in usage.stderr
    server_error = _cli("partition", str(model), "--partitioner", "nope",
                        "--target", server_address)
    assert server_error.returncode == 1 and "UNKNOWN_PARTITIONER" in server_error.stderr
    unreachable = _cli("list", "--target", "127.0.0.1:1", "--timeout", "10")
    assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
