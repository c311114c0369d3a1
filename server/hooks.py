"""Runs a hosted partitioner's hooks on a decoded program and states the answers as messages.

This is the server's half of the proxied ``Partitioner`` contract
(``executorch/exir/backend/partitioner.py``): each function takes a live partitioner and a
program rebuilt by the codec, calls one hook, and returns what the client needs to reproduce the
hook's effect on its own program object.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server import reasons

DELEGATION_TAG = "delegation_tag"
#: The traceback crosses in a trailer; keep its tail within gRPC's metadata limits.
MAX_TRACEBACK_CHARS = 16 << 10


class PartitionerRaised(Exception):
    """The hosted partitioner raised; carries the exception as a message."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.remote = remote_exception(exc)


def remote_exception(exc: BaseException) -> pb.RemoteException:
    """The wire form of an exception: class name, ``str()`` and formatted traceback."""
    # The message the exception was built with, so that the client rebuilds an equal one
    # (str(KeyError("k")) is "'k'", but KeyError("'k'") is not KeyError("k")).
    args = exc.args
    message = args[0] if len(args) == 1 and isinstance(args[0], str) else str(exc)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > MAX_TRACEBACK_CHARS:
        tb = "...\n" + tb[-MAX_TRACEBACK_CHARS:]
    return pb.RemoteException(
        type=type(exc).__name__, message=message, traceback=tb, without_arguments=not args
    )


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        raise PartitionerRaised(e) from e


def _meta_snapshot(ep: ExportedProgram) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (path, node.name): dict(node.meta)
        for path, gm in codec.graph_modules(ep.graph_module)
        for node in gm.graph.nodes
    }


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:
        return False


def partition(partitioner: Partitioner, ep: ExportedProgram) -> pb.PartitionResponse:
    """Run ``partition(ep)``; return its tags, partition tags and every other meta change,
    and a reason for every call_function node left untagged (:mod:`.reasons`: what the
    partitioner said during this call, or a derived reason).

    Raises:
        PartitionerRaised: the partitioner raised.
        codec.UnrepresentableMeta: it wrote a meta value that cannot cross; names node and key.
    """
    before = _meta_snapshot(ep)
    with reasons.capture() as said:
        result = _call(partitioner.partition, ep)
    if not isinstance(result, PartitionResult):
        raise PartitionerRaised(
            TypeError(f"partition() returned {type(result).__name__}, not a PartitionResult")
        )
    tagged = result.tagged_exported_program
    response = pb.PartitionResponse()
    for tag, spec in (result.partition_tags or {}).items():
        response.partition_tags.add(
            tag=tag,
            delegation_spec=pb.DelegationSpec(
                backend_id=spec.backend_id,
                compile_specs=[
                    pb.CompileSpec(key=cs.key, value=bytes(cs.value)) for cs in spec.compile_specs
                ],
            ),
        )
    for path, gm in codec.graph_modules(tagged.graph_module):
        for node in gm.graph.nodes:
            old = before.get((path, node.name), {})
            ref = pb.NodeRef(graph=path, name=node.name)
            for key, value in node.meta.items():
                if key in old and _same(old[key], value):
                    continue
                if key == DELEGATION_TAG:
                    if not isinstance(value, str):
                        raise codec.UnrepresentableMeta(
                            f"node {node.name!r}: delegation_tag is a {type(value).__name__}"
                        )
                    response.tags.append(pb.NodeTag(node=ref, tag=value))
                    continue
                where = f"graph {path or '<root>'!r}, node {node.name!r}, meta key {key!r}"
                response.meta_updates.append(
                    pb.MetaUpdate(
                        node=ref, key=key, value=codec.encode_meta_value(value, where=where)
                    )
                )
            for key in old.keys() - node.meta.keys():
                response.meta_updates.append(pb.MetaUpdate(node=ref, key=key, removed=True))
    response.rejections.extend(
        reasons.to_message(r) for r in reasons.rejections(partitioner, tagged, said)
    )
    return response


def ops_to_not_decompose(
    partitioner: Partitioner, ep: ExportedProgram
) -> pb.OpsToNotDecomposeResponse:
    """Run ``ops_to_not_decompose(ep)``; evaluate its filter on every node of every graph.

    Raises:
        PartitionerRaised: the hook itself raised (a filter raising on a node is recorded in
            ``failures`` instead).
    """
    ops, check = _call(partitioner.ops_to_not_decompose, ep)
    response = pb.OpsToNotDecomposeResponse(
        ops=[codec.op_name(op) for op in ops], has_filter=check is not None
    )
    if check is None:
        return response
    for path, gm in codec.graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            ref = pb.NodeRef(graph=path, name=node.name)
            try:
                answer = check(node)
            except Exception as e:
                response.failures.append(pb.NodeFailure(node=ref, exception=remote_exception(e)))
                continue
            if answer:
                response.supported.append(ref)
    return response


def transform_for_pre_decomposition(
    partitioner: Partitioner, ep: ExportedProgram
) -> ExportedProgram | None:
    """Run ``transform_for_pre_decomposition(ep)``; None when it returned ``ep`` unchanged:
    the same object, the same graph, and the same tensor objects, none written in place."""
    before = codec.fingerprint(ep)
    tensors = _tensor_versions(ep)
    out = _call(partitioner.transform_for_pre_decomposition, ep)
    if not isinstance(out, ExportedProgram):
        raise PartitionerRaised(
            TypeError(
                f"transform_for_pre_decomposition returned {type(out).__name__}, "
                "not an ExportedProgram"
            )
        )
    if (
        out is ep
        and codec.first_difference(before, codec.fingerprint(out)) is None
        and _tensor_versions(out) == tensors
    ):
        return None
    return out


def _tensor_versions(ep: ExportedProgram) -> dict[str, tuple[int, int]]:
    """Each state_dict and constant tensor by name: its identity and version counter."""
    return {
        f"{kind}:{name}": (id(t), getattr(t, "_version", 0))
        for kind, tensors in (("state_dict", ep.state_dict), ("constants", ep.constants))
        for name, t in tensors.items()
    }


__all__ = [
    "PartitionerRaised",
    "ops_to_not_decompose",
    "partition",
    "remote_exception",
    "transform_for_pre_decomposition",
]
