"""``serve --workers N``: N processes on one port, a shared blob directory, restarts, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from servers import serve_process  # (tests/ is on sys.path)
from torch.export import export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.channel import open_channel
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

#: Minutes of subprocess fleets and soaks: `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _wait(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(600)
def test_two_workers_share_one_port_and_blob_dir(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    with serve_process(
        tmp_path / "server.log", "--workers", "2", "--blob-dir", str(blobs), "--grace", "5",
        pattern=r"with 2 workers on (127\.0\.0\.1:\d+)$",
    ) as (proc, target, _):
        workers = _children(proc.pid)
        assert len(workers) == 2

        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
        ep = export(model, (torch.randn(2, 16),), strict=True)
        local = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        expected = local.to_executorch().buffer
        # Each connection lands on one worker; several partitioners, several connections,
        # every one gives the local bytes, and the blobs they upload are shared on disk.
        options = [("grpc.use_local_subchannel_pool", 1)]
        for _ in range(3):
            remote = RemotePartitioner(target, "xnnpack", timeout=300, options=options)
            got = to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer
            remote.close()
            assert got == expected
        assert any(blobs.rglob("*")), "the workers keep blobs in --blob-dir"

        # A worker that dies is restarted; the port keeps serving meanwhile.
        os.kill(workers[0], signal.SIGKILL)
        assert _wait(lambda: len(_children(proc.pid)) == 2
                     and workers[0] not in _children(proc.pid), 180)
        with open_channel(target) as channel:
            stub = pb_grpc.RemotePartitionerStub(channel)
            listed = stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=60)
        assert "xnnpack" in [p.name for p in listed.partitioners]

        # SIGTERM stops every worker, and the supervisor exits 0.
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert not any(Path(f"/proc/{w}").exists() and
                       "zombie" not in Path(f"/proc/{w}/status").read_text() for w in workers)
        with pytest.raises(grpc.RpcError), open_channel(target) as channel:
            pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
                pb.ListPartitionersRequest(), timeout=5)


def test_workers_refuse_what_one_server_refuses() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "serve", "--address",
         "0.0.0.0:0", "--workers", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "refusing to listen" in result.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "serve", "--workers", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "not a positive number" in bad.stderr
