"""The ``Quantize`` RPC's logic in plain Python: a hosted PT2E quantizer's steps on the client's
module, rebuilt here, stated as what the client applies to its own module.

``prepare_pt2e(model, quantizer)`` calls ``quantizer.transform_for_annotation(model)``,
``quantizer.annotate(model)`` and ``quantizer.validate(model)`` back to back
(``torchao/quantization/pt2e/quantize_pt2e.py``). The client's ``RemoteQuantizer`` sends its
module once, at the first of them, lifted into a program (:func:`codec.lift_module`); here the
module is rebuilt (:func:`codec.unlift_program`, which checks the client's fingerprint) and the
three steps run on it as they would have on the client. The answer states, per step, what the
step changed in the graph (:class:`codec.ModuleSnapshot`), the annotations ``annotate`` left
(:func:`codec.encode_annotations`: observers as allow-listed names), the generator state after
the transform (the one after the last step is the hook convention's ``rng_state``), and the
exception a step raised, with the step: the client raises it where the local quantizer would
have. A transform whose changes the edits cannot state is answered with its whole module
(``transform_module``); anything else that cannot be stated (an annotate step's, an observer
outside the allow-list) is ``UNREPRESENTABLE_RESULT`` (raised here as
:class:`codec.UnrepresentableMeta`), never a silent difference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch.export import ExportedProgram

from remote_partitioner.proto import codec
from remote_partitioner.proto.errors import Reason, ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server import hooks, value_reads
from remote_partitioner.server.instance import PartitionerInstance, build_hosted

logger = logging.getLogger(__name__)
_M = TypeVar("_M")


def build_quantizer(instance: PartitionerInstance, ref: pb.QuantizerRef) -> Any:
    """Build the hosted quantizer ``ref`` names (a torchao ``Quantizer``).

    Raises:
        ServiceError: UNKNOWN_QUANTIZER; INVALID_SPEC (a duplicate, unknown or ill-typed
            key); PARTITIONER_RAISED (its constructor refused the spec).
    """
    return build_hosted(
        instance.quantizers, ref, Reason.UNKNOWN_QUANTIZER, name_field="quantizer.name"
    )


def run(
    quantizer: Any,
    ep: ExportedProgram,
    request: pb.QuantizeRequest,
    store_blobs: Callable[[Mapping[str, Any]], None],
) -> pb.QuantizeResponse:
    """Rebuild the client's module from ``ep`` and ``request.unlift``, run ``quantizer``'s steps
    (``request.steps``) on it, and return their edits, annotations and generator states.

    A transform whose changes the edits cannot state (Arm's pass pipeline) is answered with the
    module it returned, whole (``transform_module``: lifted as the client lifts its own, its
    tensors' blobs given to ``store_blobs`` for the client to read); on a module whose tensors
    the client withheld that is ``TENSOR_DATA_REQUIRED`` first, since the module goes back with
    its tensors' data.

    A step that raises ends the run: the response names the step and carries the exception
    (``raised_step``, ``raised``), with the edits of the steps before it.

    Raises:
        ServiceError: FINGERPRINT_MISMATCH (the rebuilt module differs from the client's),
            INVALID_PROGRAM (the unlift table does not fit the program).
        codec.UnrepresentableMeta: a step changed the module in a way the edits cannot
            state, or annotated with a constructor outside the allow-list.
    """
    try:
        gm = codec.unlift_program(ep, request.unlift)
    except codec.FingerprintMismatch as e:
        raise ServiceError(Reason.FINGERPRINT_MISMATCH, str(e)) from e
    except codec.ProgramDecodeError as e:
        raise ServiceError(
            Reason.INVALID_PROGRAM, f"the module cannot be rebuilt: {e}", field="unlift"
        ) from e
    except Exception as e:  # a table the checks above did not foresee: still the client's
        logger.exception("rebuilding a module failed")
        raise ServiceError(
            Reason.INVALID_PROGRAM,
            f"the module cannot be rebuilt: {type(e).__name__}: {e}", field="unlift",
        ) from e
    response = pb.QuantizeResponse()
    if request.steps != pb.QUANTIZE_STEPS_ANNOTATE:
        snapshot = codec.ModuleSnapshot(gm)
        try:
            out = quantizer.transform_for_annotation(gm)
            if not isinstance(out, torch.fx.GraphModule):
                raise TypeError(
                    f"transform_for_annotation returned {type(out).__name__}, "
                    "not a torch.fx.GraphModule"
                )
        except Exception as e:
            return _raised(response, pb.QUANTIZE_STEP_TRANSFORM, e)
        try:
            response.transform_edits.CopyFrom(_stated(snapshot.edits, out))
        except codec.UnrepresentableMeta as e:
            if value_reads.is_watching():
                raise value_reads.TensorDataRequired(
                    "the transform's module goes back whole, with its tensors' data"
                ) from None
            logger.debug("transform_for_annotation answered with its module: %s", e)
            response.transform_module.CopyFrom(
                _stated(lambda gm: _whole_module(gm, store_blobs), out)
            )
        if request.rng_state:  # the caller's generator, never the server's own
            response.transform_rng_state = torch.get_rng_state().numpy().tobytes()
        gm = out
    snapshot = codec.ModuleSnapshot(gm)
    try:
        quantizer.annotate(gm)  # in place; prepare_pt2e ignores what it returns
    except Exception as e:
        return _raised(response, pb.QUANTIZE_STEP_ANNOTATE, e)
    response.annotate_edits.CopyFrom(_stated(snapshot.edits, gm))
    response.annotations.CopyFrom(_stated(codec.encode_annotations, gm))
    try:
        quantizer.validate(gm)
    except Exception as e:
        return _raised(response, pb.QUANTIZE_STEP_VALIDATE, e)
    return response


def _stated(state: Callable[[torch.fx.GraphModule], _M], gm: torch.fx.GraphModule) -> _M:
    """``state(gm)``: a step's result as a message; anything unforeseen that stops it from
    being stated is UNREPRESENTABLE_RESULT (as :class:`codec.UnrepresentableMeta`), never a
    status without a reason."""
    try:
        return state(gm)
    except codec.UnrepresentableMeta:
        raise
    except Exception as e:
        logger.exception("stating a quantizer step's result failed")
        raise codec.UnrepresentableMeta(
            f"the quantizer's result cannot be stated: {type(e).__name__}: {e}"
        ) from e


def _whole_module(
    gm: torch.fx.GraphModule, store_blobs: Callable[[Mapping[str, Any]], None]
) -> pb.ReplacedModule:
    """``gm`` stated whole (see :func:`run`): lifted as the client lifts its own, its blobs
    given to ``store_blobs``."""
    lifted, table = codec.lift_module(gm)
    encoded = codec.encode_program(lifted)
    store_blobs(encoded.blobs)
    return pb.ReplacedModule(program=encoded.message, unlift=table)


def _raised(
    response: pb.QuantizeResponse, step: pb.QuantizeStep, exc: Exception
) -> pb.QuantizeResponse:
    if isinstance(exc, codec.UnrepresentableMeta):  # ours, not the quantizer's
        raise exc
    response.raised_step = step
    response.raised.CopyFrom(hooks.remote_exception(exc))
    return response


__all__ = ["build_quantizer", "run"]
