"""The result cache: `Lower` answered again without a lowering, and every cached answer kept in
``--blob-dir`` for a restarted server and for the replicas sharing the directory.

A hit must give the bytes a fresh lowering gives (compared with the local lowering, computed
here), must not wait for the process's hook slot, and must never come from an entry whose
blobs are gone, that is corrupt, or that another environment wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from models import MlpCumsum, pt2_bytes  # (tests/ is on sys.path)
from servers import inproc_server, launch, served

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server.blobstore import Blob, BlobStore, DirBlobStore
from remote_partitioner.server.blobstore.entries import DirEntryStore
from remote_partitioner.server.results import ResultCache, environment_key, results_directory
from remote_partitioner.server.versions import versions_key

#: Time a hit gets with the hook slot taken (a miss waits for the slot until its deadline).
_HIT_SECONDS = 30.0
_METRICS_URL = re.compile(r"metrics on (http://\S+/metrics)")
_LOOKUPS = re.compile(r'^remote_partitioner_result_cache_lookups\{result="(\w+)"\} (\S+)$', re.M)


def _export() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(MlpCumsum().eval(), (torch.randn(2, 8),), strict=True)


@pytest.fixture(scope="module")
def archive() -> bytes:
    return pt2_bytes(_export())


@pytest.fixture(scope="module")
def local_pte() -> bytes:
    """The local XNNPACK lowering of the archive's program."""
    lowered = to_edge_transform_and_lower(_export(), partitioner=[XnnpackPartitioner()])
    return bytes(lowered.to_executorch().buffer)


def _lower(target: str, archive: bytes, timeout: float = 300, **options: bool) -> bytes | None:
    with LowerClient(target, timeout=timeout) as client:
        return client.lower(archive, [partitioner_ref("xnnpack")], **options).pte


def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Wait (bounded) for ``condition``: a lowering's answer is stored once it has been sent."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.02)


@contextlib.contextmanager
def _hook_slot_taken(server: object) -> Iterator[None]:
    """Hold the server's one hook slot, as a long lowering would, for the block."""
    instance = server.servicer.instance  # type: ignore[attr-defined]
    with instance.turn(lambda: None):
        yield


# --------------------------------------------------------------------------------- in process


def test_a_repeated_lower_is_answered_from_the_cache_without_a_turn(
    archive: bytes, local_pte: bytes, tmp_path: Path
) -> None:
    cache = ResultCache(64 << 20, versions=versions_key())
    with inproc_server(result_cache=cache) as (server, target):
        assert _lower(target, archive) == local_pte
        assert (cache.hits, cache.misses) == (0, 1)
        _until(lambda: len(cache) == 1, "the lowering was not stored")
        # A repeat waits for nothing: with the hook slot taken, only a hit can answer in time.
        with _hook_slot_taken(server):
            assert _lower(target, archive, timeout=_HIT_SECONDS) == local_pte
        assert (cache.hits, cache.misses) == (1, 1)
        # Other options are another lowering.
        with LowerClient(target, timeout=300) as client:
            result = client.lower(archive, [partitioner_ref("xnnpack")], report_only=True)
        assert result.pte is None and result.report.methods[0].delegated
        assert (cache.hits, cache.misses) == (1, 2)
        _until(lambda: len(cache) == 2, "the report-only lowering was not stored")
        with _hook_slot_taken(server), LowerClient(target, timeout=_HIT_SECONDS) as client:
            again = client.lower(archive, [partitioner_ref("xnnpack")], report_only=True)
        assert again.pte is None and again.report == result.report



def test_a_repeat_while_the_first_answer_is_being_stored_is_not_lowered_again(
    archive: bytes, local_pte: bytes
) -> None:
    pte_hash = hashlib.sha256(local_pte).hexdigest()
    release = threading.Event()

    class SlowVolume(BlobStore):
        """A store that takes the .pte only once released (a slow or busy volume)."""

        def put(self, hash_: str, size: int, data: Blob, *, hashed: bool = False) -> None:
            if hash_ == pte_hash:
                assert release.wait(120), "the test did not release the store"
            super().put(hash_, size, data, hashed=hashed)

    cache = ResultCache(64 << 20, versions=versions_key())
    with inproc_server(result_cache=cache, blob_store=SlowVolume()) as (server, target):
        instance = server.servicer.instance
        try:
            assert _lower(target, archive) == local_pte
            # Not stored yet: with the hook slot taken, only the first answer, held until it
            # is stored, can answer the repeat in time (a second lowering would wait).
            with _hook_slot_taken(server):
                assert _lower(target, archive, timeout=_HIT_SECONDS) == local_pte
            assert (cache.hits, cache.misses, len(cache)) == (1, 1, 0)  # (a hit from memory)
            assert len(instance.lowerings_being_stored) == 1
        finally:
            release.set()
        _until(lambda: not instance.lowerings_being_stored, "the answer was not stored")
        assert len(cache) == 1
        with _hook_slot_taken(server):
            assert _lower(target, archive, timeout=_HIT_SECONDS) == local_pte
        assert (cache.hits, cache.misses) == (2, 1)


def test_an_entry_whose_pte_is_gone_is_lowered_again(
    archive: bytes, local_pte: bytes, tmp_path: Path
) -> None:
    store = DirBlobStore(tmp_path / "blobs", evict_grace=0)
    cache = ResultCache(64 << 20, versions=versions_key(),
                        directory=results_directory(tmp_path / "blobs"))
    with inproc_server(blob_store=store, result_cache=cache) as (server, target):
        assert _lower(target, archive) == local_pte
        pte = store.path(hashlib.sha256(local_pte).hexdigest())
        _until(lambda: len(cache) == 1, "the lowering was not stored")
        assert os.path.exists(pte), "the lowering's .pte is not in the blob store"
        os.unlink(pte)
        assert _lower(target, archive) == local_pte
        assert cache.hits == 0, "an entry was used without its .pte"
        _until(lambda: os.path.exists(pte), "the .pte was not stored again")
        # The entry is whole again: a repeat hits.
        with _hook_slot_taken(server):
            assert _lower(target, archive, timeout=_HIT_SECONDS) == local_pte
        assert cache.hits == 1


def test_entries_persist_and_corrupt_or_foreign_ones_are_misses(tmp_path: Path) -> None:
    directory = tmp_path / "results"
    response = pb.LowerResponse(pte=pb.Digest(hash="ab" * 32, size_bytes=3))
    request = pb.LowerRequest(archive=pb.Digest(hash="cd" * 32, size_bytes=5))
    first = ResultCache(1 << 20, versions="env-a", directory=directory)
    key = first.key("Lower", request)
    first.put(key, response)

    # Another process on the same directory (a replica, or this server restarted).
    again = ResultCache(1 << 20, versions="env-a", directory=directory)
    assert again.get(key, pb.LowerResponse) == response
    assert (again.hits, again.disk_hits) == (1, 1)
    assert again.get(key, pb.LowerResponse) == response  # now from memory
    assert (again.hits, again.disk_hits) == (2, 1)

    # Another environment computes other keys: it never reads env-a's answers.
    other = ResultCache(1 << 20, versions="env-b", directory=directory)
    assert other.key("Lower", request) != key
    assert other.get(other.key("Lower", request), pb.LowerResponse) is None

    # A corrupt file is a miss, and is removed.
    path = DirEntryStore(directory, 1 << 20).path(key)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0xFF
    os.chmod(path, 0o644)
    Path(path).write_bytes(bytes(data))
    fresh = ResultCache(1 << 20, versions="env-a", directory=directory)
    assert fresh.get(key, pb.LowerResponse) is None
    assert not os.path.exists(path)


def test_the_disk_entries_are_bounded(tmp_path: Path) -> None:
    directory = tmp_path / "results"
    cache = ResultCache(64 << 10, versions="v", directory=directory)
    assert cache.disk is not None
    for i in range(100):  # 100 entries of about 4 KiB in a 64 KiB bound
        cache.put(cache.key("Lower", pb.LowerRequest(archive=pb.Digest(size_bytes=i))),
                  pb.LowerResponse(data=bytes(4000)))
    assert 0 < cache.disk.nbytes <= 64 << 10


def test_the_environment_key_names_the_installed_packages() -> None:
    key = environment_key()
    assert re.fullmatch(r"[0-9a-f]{64}", key) and key == environment_key()
    assert versions_key().endswith(key)


# ----------------------------------------------------------------------------- server processes


def _lookups(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in _LOOKUPS.finditer(text)}


@contextlib.contextmanager
def _server(log: Path, blob_dir: Path) -> Iterator[tuple[str, str]]:
    """A `serve --blob-dir` process with metrics; yields (target, metrics URL)."""
    with served(launch(log, "--no-plugins", "--blob-dir", str(blob_dir),
                       "--metrics-port", "0")) as (_, target, log_path):
        url = _METRICS_URL.search(log_path.read_text(errors="replace"))
        assert url, log_path.read_text()[-4000:]
        yield target, url.group(1)


def _remote_pte(target: str) -> bytes:
    lowered = to_edge_transform_and_lower(
        _export(), partitioner=[RemotePartitioner(target, "xnnpack")]
    )
    return bytes(lowered.to_executorch().buffer)


@pytest.mark.slow  # three server processes
def test_replicas_and_a_restarted_server_answer_from_the_shared_directory(
    archive: bytes, local_pte: bytes, tmp_path: Path
) -> None:
    blob_dir = tmp_path / "shared"
    with _server(tmp_path / "a.log", blob_dir) as (a, a_metrics), \
            _server(tmp_path / "b.log", blob_dir) as (b, b_metrics):
        assert _lower(a, archive) == local_pte
        _until(lambda: any(len(p.name) == 64 for p in (blob_dir / "results").glob("??/*")),
               "the lowering was not stored in the directory")
        assert _remote_pte(a) == local_pte
        assert _lookups(a_metrics)["disk_hit"] == 0
        # The replica lowered nothing: every answer comes from the directory.
        assert _lower(b, archive) == local_pte
        assert _remote_pte(b) == local_pte
        b_lookups = _lookups(b_metrics)
        assert b_lookups["miss"] == 0 and b_lookups["disk_hit"] >= 2, b_lookups
    # Both stopped; a server started again on the directory remembers.
    with _server(tmp_path / "c.log", blob_dir) as (c, c_metrics):
        assert _lower(c, archive) == local_pte
        assert _remote_pte(c) == local_pte
        c_lookups = _lookups(c_metrics)
        assert c_lookups["miss"] == 0 and c_lookups["disk_hit"] >= 2, c_lookups
