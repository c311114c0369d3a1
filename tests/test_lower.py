"""The Lower RPC and the client command line: archive in, report and byte-identical .pte out."""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import grpc
import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from models import MlpCumsum, pt2_bytes  # (tests/ is on sys.path)

from remote_partitioner.client.errors import PartitionerNotFoundError, RemotePartitionerError
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.errors import ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.blobstore.base import Blob
from remote_partitioner.server.pt2 import read_pt2
from remote_partitioner.server.uploads import ByteBudget, UploadAssembly


@pytest.fixture(scope="module")
def archive() -> bytes:
    torch.manual_seed(0)
    return pt2_bytes(
        torch.export.export(MlpCumsum().eval(), (torch.randn(2, 8),), strict=True)
    )


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
    assert result.pte_digest == digest_of(result.pte)  # (what the command line prints)
    (method,) = result.report.methods
    assert method.method == "forward"
    (xnn,) = method.delegated
    assert xnn.backend_id == "XnnpackBackend" and xnn.partitions >= 1 and xnn.nodes >= 3
    cpu = {op.op: op.count for op in method.cpu_ops}
    assert cpu.get("aten.cumsum.default") == 1, cpu
    assert method.total_nodes == xnn.nodes + sum(cpu.values())


class _Wide(torch.nn.Module):
    """2 MiB of weights: its archive is stored in a memory file (MEMORY_FILE_MIN_BYTES) and
    read through a private writable mapping, whose payloads the program's tensors share."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(512, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(self.fc(x)), dim=1)


def _wide_archive() -> bytes:
    torch.manual_seed(1)
    return pt2_bytes(torch.export.export(_Wide().eval(), (torch.randn(2, 512),), strict=True))


@pytest.mark.slow
def test_lower_of_an_archive_read_in_place_gives_the_local_pte(server_address: str) -> None:
    archive = _wide_archive()
    assert len(archive) > 2 << 20
    with LowerClient(server_address, timeout=600) as client:
        result = client.lower(archive, [partitioner_ref("xnnpack")])
    assert result.pte == _local_pte(archive)


def _address(buffer: mmap.mmap) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns of a buffer it may not write to)
        return torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()


def _storage_within(t: torch.Tensor, start: int, nbytes: int) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return start <= ptr < start + nbytes


def test_read_pt2_shares_a_writable_archive_and_copies_a_read_only_one(tmp_path: Path) -> None:
    archive = _wide_archive()
    expected = torch.export.load(io.BytesIO(archive)).state_dict  # trusted: written here
    # Both page-aligned (as the blob store's mappings are): one writable, one read-only.
    writable = mmap.mmap(-1, len(archive))
    writable[:] = archive
    (tmp_path / "model.pt2").write_bytes(archive)
    with open(tmp_path / "model.pt2", "rb") as f:
        read_only = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    shared = read_pt2(memoryview(writable))["model"].state_dict
    copied = read_pt2(memoryview(read_only))["model"].state_dict
    assert shared.keys() == copied.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(shared[name], tensor) and torch.equal(copied[name], tensor), name
        assert _storage_within(shared[name], _address(writable), len(archive)), name
        assert not _storage_within(copied[name], _address(read_only), len(archive)), name
        copied[name].data.add_(1)  # its own memory


class _RecordingStore(BlobStore):
    """The in-memory store, recording how each blob was verified."""

    def __init__(self) -> None:
        super().__init__()
        self.hashed: list[bool] = []

    def put(self, hash_: str, size: int, data: Blob, *, hashed: bool = False) -> None:
        self.hashed.append(hashed)
        super().put(hash_, size, data, hashed=hashed)


def _upload(store: BlobStore, digest: pb.Digest, data: bytes) -> None:
    assembly = UploadAssembly(store, lambda d, what: None, ByteBudget(1 << 30, 1.0))
    try:
        for offset in range(0, len(data), 1 << 20):
            done = assembly.feed(pb.UploadBlobsRequest(
                digest=digest, offset=offset, data=data[offset : offset + (1 << 20)]))
            if done is not None:
                assembly.commit(done)
        assembly.finish()
    finally:
        assembly.discard()


def test_an_upload_is_verified_as_its_chunks_arrive() -> None:
    data = os.urandom(3 << 20)
    digest = digest_of(data)
    store = _RecordingStore()
    _upload(store, digest, data)
    # Hashed chunk by chunk as it arrived: the store is not asked to hash it whole again.
    assert store.hashed == [True] and store.get(digest.hash) == data
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(ServiceError) as e:
        _upload(store, digest_of(os.urandom(len(data))), bytes(bad))
    assert e.value.reason == "DIGEST_MISMATCH"
    assert len(store) == 1


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
    assert f"sha256 {hashlib.sha256(out.read_bytes()).hexdigest()}" in done.stdout
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


@pytest.mark.slow
def test_a_held_pte_is_not_sent_again(server_address: str, archive: bytes,
                                      tmp_path: Path) -> None:
    pte = _local_pte(archive)
    with LowerClient(server_address, timeout=600) as client:
        first = client.lower(archive, [partitioner_ref("xnnpack")])
        assert first.pte == pte and not first.pte_held
        # The client holds it: the answer names it, and no chunk is written.
        with open(tmp_path / "nothing", "wb") as into:
            held = client.lower(archive, [partitioner_ref("xnnpack")], into=into,
                                held_pte=digest_of(pte))
        assert held.pte_held and held.pte is None and held.pte_digest == digest_of(pte)
        assert (tmp_path / "nothing").read_bytes() == b""
        assert held.report == first.report
        # Another .pte held, or the same hash with another size: the bytes come.
        for other in (digest_of(b"another program"),
                      pb.Digest(hash=digest_of(pte).hash, size_bytes=len(pte) + 1)):
            sent = client.lower(archive, [partitioner_ref("xnnpack")], held_pte=other)
            assert sent.pte == pte and not sent.pte_held
        with pytest.raises(RemotePartitionerError) as e:
            client.lower(archive, [partitioner_ref("xnnpack")],
                         held_pte=pb.Digest(hash="not a digest", size_bytes=1))
        assert e.value.reason == "INVALID_DIGEST"
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow
def test_cli_lower_neither_hashes_nor_downloads_again(
    server_address: str, archive: bytes, tmp_path: Path
) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(archive)
    out = tmp_path / "model.pte"
    pte = _local_pte(archive)

    def lower() -> str:
        done = _cli("lower", str(model), "-o", str(out), "--partitioner", "xnnpack",
                    "--target", server_address)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert "wrote" in lower() and out.read_bytes() == pte
    written = out.stat()
    assert "kept" in lower()  # the output holds this .pte: left as it is, nothing sent
    assert out.read_bytes() == pte
    assert (out.stat().st_ino, out.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    # Changed in place (the same size): its bytes come again.
    with open(out, "r+b") as f:
        f.seek(len(pte) // 2)
        f.write(b"\0\0\0\0")
    assert "wrote" in lower() and out.read_bytes() == pte
    # Another archive of the same size written over the model: lowered as itself.
    torch.manual_seed(1)
    other = pt2_bytes(torch.export.export(MlpCumsum().eval(), (torch.randn(2, 8),), strict=True))
    assert len(other) == len(archive) and other != archive
    model.write_bytes(other)
    assert "wrote" in lower() and out.read_bytes() == _local_pte(other) != pte


@pytest.mark.slow
def test_cli_lower_writes_the_pte_whole_or_not_at_all(
    server_address: str, archive: bytes, tmp_path: Path
) -> None:
    model = tmp_path / "model.pt2"
    model.write_bytes(archive)
    real = tmp_path / "real.pte"
    real.write_bytes(b"older")
    real.chmod(0o640)
    link = tmp_path / "link.pte"
    link.symlink_to(real)
    refused = _cli("lower", str(model), "-o", str(link), "--partitioner", "nope",
                   "--target", server_address)
    assert refused.returncode == 1 and real.read_bytes() == b"older"
    done = _cli("lower", str(model), "-o", str(link), "--partitioner", "xnnpack",
                "--target", server_address, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    pte = _local_pte(archive)
    assert link.is_symlink() and real.read_bytes() == pte  # written where the link points
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # as writing over it keeps it
    output = json.loads(done.stdout)["output"]
    assert output == {"path": str(link), "bytes": len(pte),
                      "sha256": hashlib.sha256(pte).hexdigest()}
    # (the .pte went to a temporary file as it arrived: none is left behind)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pte", "model.pt2", "real.pte"]


@pytest.mark.slow
def test_cli_reads_an_archive_from_a_pipe(server_address: str, archive: bytes) -> None:
    # A regular file is mapped; a pipe cannot be, and is read.
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "partition", "/dev/stdin",
         "--partitioner", "xnnpack", "--target", server_address, "--json"],
        input=archive, capture_output=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["methods"][0]["delegated"][0]["backend_id"] == "XnnpackBackend"


@pytest.mark.slow
def test_lower_into_a_file(server_address: str, archive: bytes, tmp_path: Path) -> None:
    with LowerClient(server_address, timeout=600) as client, open(tmp_path / "m.pte", "wb") as f:
        f.write(b"kept")
        result = client.lower(archive, [partitioner_ref("xnnpack")], into=f)
    assert result.pte is None and result.pte_digest is not None
    written = (tmp_path / "m.pte").read_bytes()
    assert written[:4] == b"kept" and digest_of(written[4:]) == result.pte_digest


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
