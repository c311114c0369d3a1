"""The ``Lower`` RPC's logic in plain Python: a PT2 archive lowered whole on the server, and
answered again from the result cache.

A lowering is a function of the archive's bytes (named by digest), the partitioner references
with their specs, the options, and the server's environment (the result cache's versions
key): its answer, the delegation report and the ``.pte`` digest, is kept in the result cache
under the request's key, and the ``.pte`` itself in the blob store. A repeat with the same
request, from any client (and, with ``--blob-dir``, on any replica sharing the directory or
after a restart), is answered from them without a turn: the same bytes as the first lowering,
since they are its bytes. An entry is used only while the archive and the ``.pte`` are both
held; otherwise the archive is lowered again.

A client that already holds the ``.pte`` (the output of an earlier lowering) names it in
``held_pte``: the answer then carries the digest without the bytes, and the request's key
leaves ``held_pte`` out (:func:`answer_depends_on`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from remote_partitioner.proto import codec
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.errors import Reason, ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server import hooks, lowering, pt2
from remote_partitioner.server.blobstore import BlobError, BlobView, check_digest
from remote_partitioner.server.instance import (
    PartitionerInstance,
    TimeRemaining,
    check_deadline,
    partitioner_raised,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lowered:
    """What ``Lower`` answers: the report, and (unless ``report_only``) the ``.pte``'s digest
    and bytes."""

    report: pb.DelegationReport
    pte_digest: pb.Digest | None
    pte: BlobView | bytes | None
    #: The request's result cache key.
    key: str
    #: Whether the answer came from the result cache (else: :func:`remember` it).
    cached: bool = False


def lower(
    instance: PartitionerInstance, request: pb.LowerRequest, time_remaining: TimeRemaining
) -> Lowered:
    """Lower the request's PT2 archive with its partitioners, or answer a repeat from the
    result cache.

    Raises:
        ServiceError: INVALID_SPEC (no partitioner); the partitioner lookup's and the digest
            checks' errors (INVALID_DIGEST for ``held_pte`` too); BLOB_MISSING (the archive
            is not held); INVALID_PROGRAM (the archive cannot be read); DEADLINE_PASSED;
            PARTITIONER_RAISED.
    """
    if not request.partitioners:
        raise ServiceError(Reason.INVALID_SPEC, "no partitioner given", field="partitioners")
    partitioners = [instance.partitioner(ref) for ref in request.partitioners]
    instance.check_digest(request.archive, "archive")
    if request.HasField("held_pte"):
        try:
            check_digest(request.held_pte.hash, request.held_pte.size_bytes)
        except BlobError as e:
            raise ServiceError(Reason.INVALID_DIGEST, str(e), field="held_pte") from e
    key = instance.results.key("Lower", answer_depends_on(request))
    with instance.lowerings_lock:
        being_stored = instance.lowerings_being_stored.get(key)
    if being_stored is not None:  # a repeat that came before the first answer was stored
        instance.results.count_hit()
        return dataclasses.replace(being_stored, cached=True)
    hit = _cached(instance, key, request)
    if hit is not None:
        return hit
    with instance.turn(time_remaining):
        archive = instance.required_blob(request.archive, "archive")
        try:
            programs = pt2.read_pt2(memoryview(archive))
        except (ValueError, codec.CodecError) as e:
            raise ServiceError(
                Reason.INVALID_PROGRAM, f"the archive cannot be read: {e}"
            ) from e
        check_deadline(time_remaining)
        # The backends' preprocess runs inside the lowering: it starts from the state a
        # fresh process has, as Preprocess does (HostedBackend.fresh_state).
        for backend in instance.backends:
            if backend.fresh_state is not None:
                backend.fresh_state()
        try:
            methods, pte = lowering.lower(
                programs, partitioners,
                check_ir_validity=not request.options.skip_ir_validity_check,
                report_only=request.options.report_only,
            )
        except hooks.PartitionerRaised as e:
            raise partitioner_raised(e.remote) from e
    report = report_message(methods)
    digest = digest_of(pte) if pte is not None else None
    return Lowered(report, digest, pte, key)


def answer_depends_on(request: pb.LowerRequest) -> pb.LowerRequest:
    """``request`` without what its answer does not depend on (``held_pte``, which only
    decides whether the ``.pte``'s bytes are sent): what the result cache keys on."""
    if not request.HasField("held_pte"):
        return request
    keyed = pb.LowerRequest()
    keyed.CopyFrom(request)
    keyed.ClearField("held_pte")
    return keyed


def sends_pte(request: pb.LowerRequest, lowered: Lowered) -> bool:
    """Whether the answer to ``request`` carries the ``.pte``'s bytes: there is one, and it is
    not the one the client said it holds (``held_pte``, digest and size both equal)."""
    if not lowered.pte or lowered.pte_digest is None:
        return False
    held = request.held_pte if request.HasField("held_pte") else None
    return held is None or (held.hash, held.size_bytes) != (
        lowered.pte_digest.hash, lowered.pte_digest.size_bytes
    )


def being_stored(instance: PartitionerInstance, lowered: Lowered) -> None:
    """From now until :func:`remember` has stored it, answer a repeat of a fresh lowering
    from ``lowered`` itself (rather than lowering a second time because the first answer is
    still being sent or written). The caller then calls :func:`remember_in_background`,
    whatever happens."""
    if lowered.cached or instance.results.max_bytes <= 0:
        return
    with instance.lowerings_lock:
        instance.lowerings_being_stored[lowered.key] = lowered


def remember_in_background(
    instance: PartitionerInstance, lowered: Lowered,
    submit: Callable[[Callable[[PartitionerInstance, Lowered], None], PartitionerInstance,
                      Lowered], object],
) -> None:
    """Have ``submit`` (an executor's) run :func:`remember` for a fresh lowering. A shut-down
    executor (``RuntimeError``) stores nothing, and repeats are lowered again."""
    if lowered.cached or instance.results.max_bytes <= 0:
        return
    try:
        submit(remember, instance, lowered)
    except RuntimeError:
        with instance.lowerings_lock:
            instance.lowerings_being_stored.pop(lowered.key, None)


def remember(instance: PartitionerInstance, lowered: Lowered) -> None:
    """Keep a fresh lowering's ``.pte`` in the blob store and its answer in the result cache
    (the ``.pte`` first: an entry is used only while its ``.pte`` is held). Runs once the
    answer is on its way, in the background: a store that cannot take it costs the next
    lowering, not this one (logged, never raised).
    """
    try:
        if lowered.cached or instance.results.max_bytes <= 0:
            return
        _store(instance, lowered)
    finally:
        with instance.lowerings_lock:
            if instance.lowerings_being_stored.get(lowered.key) is lowered:
                del instance.lowerings_being_stored[lowered.key]


def _store(instance: PartitionerInstance, lowered: Lowered) -> None:
    try:
        response = pb.LowerResponse(report=lowered.report)
        if lowered.pte_digest is not None:
            assert lowered.pte is not None
            instance.blobs.put(lowered.pte_digest.hash, lowered.pte_digest.size_bytes,
                               lowered.pte, hashed=True)
            response.pte.CopyFrom(lowered.pte_digest)
        instance.results.put(lowered.key, response)
    except Exception:
        logger.exception("a lowering's answer was not kept in the result cache")


def report_message(methods: Iterable[Any]) -> pb.DelegationReport:
    """``lowering.MethodReport``s as a DelegationReport message."""
    out = pb.DelegationReport()
    for m in methods:
        entry = out.methods.add(method=m.method, total_nodes=m.total_nodes)
        for backend, (partitions, nodes) in sorted(m.delegated.items()):
            entry.delegated.add(backend_id=backend, partitions=partitions, nodes=nodes)
        for op, count in sorted(m.cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])):
            entry.cpu_ops.add(op=op, count=count)
        entry.nodes.extend(m.nodes)
        entry.partitions.extend(m.partitions)
    return out


def _cached(
    instance: PartitionerInstance, key: str, request: pb.LowerRequest
) -> Lowered | None:
    """The cached answer to ``request``, if the archive and the answer's ``.pte`` are held."""
    if not instance.blobs.has(request.archive.hash, request.archive.size_bytes):
        return None
    held: list[BlobView] = []

    def usable(cached: pb.LowerResponse) -> bool:
        if not cached.HasField("pte"):
            return True
        pte = instance.blobs.get(cached.pte.hash)
        if pte is None or len(pte) != cached.pte.size_bytes:
            return False
        held.append(pte)
        return True

    cached = instance.results.get(key, pb.LowerResponse, usable)
    if cached is None:
        return None
    pte_digest = cached.pte if cached.HasField("pte") else None
    return Lowered(cached.report, pte_digest, held[0] if held else None, key, cached=True)


__all__ = [
    "Lowered", "answer_depends_on", "being_stored", "lower", "remember", "remember_in_background",
    "report_message", "sends_pte",
]
