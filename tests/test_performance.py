"""No round trip that cannot change the answer: the client's memo of repeated hook calls, the
server's result cache, canonical encodings, and each storage hashed once per lowering.

Speed itself is measured by ``bench/`` (``make bench``), not asserted here."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from servers import inproc_server  # (tests/ is on sys.path)
from torch.export import ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.proto import codec
from remote_partitioner.proto.codec import encode
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server.results import ResultCache


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _export() -> ExportedProgram:
    """A fresh export of the same model and weights (new graphs, modules and ids)."""
    torch.manual_seed(7)
    return export(_Net().eval(), (torch.randn(1, 3, 8, 8),), strict=True)


def _pte(ep: ExportedProgram, partitioner: Any) -> bytes:
    return bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)


@pytest.fixture()
def cached_server() -> Iterator[tuple[ResultCache, str]]:
    results = ResultCache()
    with inproc_server(result_cache=results) as (_, target):
        yield results, target


@pytest.mark.slow
def test_repeated_calls_on_an_unchanged_program_are_answered_from_memory(
    cached_server: tuple[ResultCache, str],
) -> None:
    _, target = cached_server
    local = _pte(_export(), XnnpackPartitioner())
    remote = RemotePartitioner(target, "xnnpack", timeout=300)
    assert _pte(_export(), remote) == local
    # to_edge_transform_and_lower asks ops_to_not_decompose twice in a row on the same
    # program, twice: the second of each pair crosses nothing.
    assert remote.stats["memo_hits"] == 2
    # With the server warm for both (nothing to upload, one request per hook call), the memo
    # saves two round trips.
    plain = RemotePartitioner(target, "xnnpack", timeout=300, memoize=False)
    assert _pte(_export(), plain) == local
    assert plain.stats["memo_hits"] == 0
    again = RemotePartitioner(target, "xnnpack", timeout=300)
    assert _pte(_export(), again) == local
    assert again.stats["memo_hits"] == 2
    assert plain.stats["calls"] - again.stats["calls"] == 2


def test_a_changed_program_is_asked_again(cached_server: tuple[ResultCache, str]) -> None:
    _, target = cached_server
    remote = RemotePartitioner(target, "xnnpack", timeout=300)
    ep = _export().run_decompositions({})

    def ask() -> int:
        before = remote.stats["memo_hits"]
        remote.ops_to_not_decompose(ep)
        return remote.stats["memo_hits"] - before

    assert ask() == 0
    assert ask() == 1
    with torch.no_grad():
        ep.state_dict["fc.bias"].add_(1.0)  # written in place: its version changes
    assert ask() == 0
    node = next(n for n in ep.graph.nodes if n.op == "call_function")
    node.meta["custom"] = {"changed": True}  # a meta value added
    assert ask() == 0
    node.meta["val"] = copy.copy(node.meta["val"])  # a meta value replaced
    assert ask() == 0
    assert ask() == 1
    other = copy.deepcopy(ep)  # an equal program, but another object: asked again
    before = remote.stats["memo_hits"]
    remote.ops_to_not_decompose(other)
    assert remote.stats["memo_hits"] == before


@pytest.mark.slow
def test_second_lowering_is_answered_from_the_result_cache(
    cached_server: tuple[ResultCache, str],
) -> None:
    results, target = cached_server
    local = _pte(_export(), XnnpackPartitioner())
    first = RemotePartitioner(target, "xnnpack", timeout=300)
    assert _pte(_export(), first) == local
    hits, entries = results.hits, len(results)
    assert entries > 0
    # Another client, another export of the same model: the same request bytes, since
    # process-local ids (graph and module addresses) are renumbered by the encoder.
    second = RemotePartitioner(target, "xnnpack", timeout=300)
    assert _pte(_export(), second) == local
    assert second.stats["bytes_uploaded"] == 0, "graphs and tensors are already held"
    hook_calls = second.stats["calls"] - 1  # ListPartitioners, then one request per hook call
    assert results.hits - hits == hook_calls
    assert len(results) == entries


def test_result_cache_is_bounded_and_returns_fresh_messages() -> None:
    cache = ResultCache(max_bytes=300)
    response = pb.OpsToNotDecomposeResponse(ops=["aten::x" * 10])
    keys = [cache.key("OpsToNotDecompose", pb.OpsToNotDecomposeRequest(
        partitioner=pb.PartitionerRef(name=f"p{i}"))) for i in range(5)]
    assert len(set(keys)) == 5
    for k in keys:
        cache.put(k, response)
    assert cache.nbytes <= 300
    assert cache.get(keys[0], pb.OpsToNotDecomposeResponse) is None  # least recent, evicted
    hit = cache.get(keys[-1], pb.OpsToNotDecomposeResponse)
    assert hit == response and hit is not response
    hit.ops.append("changed")
    assert cache.get(keys[-1], pb.OpsToNotDecomposeResponse) == response
    assert ResultCache(0).get(keys[0], pb.OpsToNotDecomposeResponse) is None


def test_each_storage_is_hashed_once_per_lowering(
    cached_server: tuple[ResultCache, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many hook calls see a tensor, its storage is hashed once per lowering."""
    import numpy as np

    _, target = cached_server
    hashed: list[tuple[int, int]] = []
    digest_of = codec.digest_of

    def counting(data: Any) -> pb.Digest:
        view = memoryview(data)
        if view.nbytes:
            hashed.append((np.frombuffer(view, dtype=np.uint8).ctypes.data, view.nbytes))
        return digest_of(data)

    ep = _export()
    monkeypatch.setattr(encode, "digest_of", counting)  # what the encoder hashes with
    remote = RemotePartitioner(target, "xnnpack", timeout=300)
    _pte(ep, remote)
    assert remote.stats["calls"] > 4 and hashed
    twice = {k for k in hashed if hashed.count(k) > 1}
    assert not twice, f"hashed more than once: {sorted(twice)}"


def test_program_by_digest_errors(cached_server: tuple[ResultCache, str]) -> None:
    """A program sent by reference: missing, not a Program, or sent both ways."""
    import grpc

    from remote_partitioner.client.blobs import upload_requests
    from remote_partitioner.client.channel import open_channel
    from remote_partitioner.client.errors import RemotePartitionerError, from_rpc_error
    from remote_partitioner.proto.digests import digest_of
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    _, target = cached_server
    stub = pb_grpc.RemotePartitionerStub(open_channel(target))
    ref = pb.PartitionerRef(name="xnnpack")
    garbage = b"\xff\xff\xff\xff not a program"
    d = digest_of(garbage)

    def status(request: pb.OpsToNotDecomposeRequest) -> tuple[grpc.StatusCode, str, str]:
        with pytest.raises(grpc.RpcError) as info:
            stub.OpsToNotDecompose(request, timeout=60)
        e = from_rpc_error(info.value)
        assert isinstance(e, RemotePartitionerError)
        return e.code, str(e.reason), str(e)

    code, reason, message = status(pb.OpsToNotDecomposeRequest(partitioner=ref, program_digest=d))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "BLOB_MISSING")
    assert d.hash in message
    stub.UploadBlobs(upload_requests([d], {d.hash: garbage}), timeout=60)
    code, reason, _ = status(pb.OpsToNotDecomposeRequest(partitioner=ref, program_digest=d))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PROGRAM")
    both = pb.OpsToNotDecomposeRequest(partitioner=ref, program_digest=d,
                                       program=pb.Program(dialect=pb.DIALECT_ATEN))
    code, reason, message = status(both)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PROGRAM")
    assert "not both" in message
    bad = pb.OpsToNotDecomposeRequest(partitioner=ref,
                                      program_digest=pb.Digest(hash="x", size_bytes=1))
    code, reason, _ = status(bad)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DIGEST")
