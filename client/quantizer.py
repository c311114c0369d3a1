"""``RemoteQuantizer``: a torchao PT2E ``Quantizer`` whose steps run on a remote server."""

from __future__ import annotations

import importlib
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import grpc
import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import Quantizer

from remote_partitioner.client.connection import (
    ServerConnection,
    listed_entry,
    set_rng_state,
)
from remote_partitioner.client.errors import (
    FingerprintMismatchError,
    IncompatibleServerError,
    QuantizerNotFoundError,
    RemotePartitionerError,
    remote_exception,
)
from remote_partitioner.proto import codec, errors
from remote_partitioner.proto.spec import SpecScalar, spec_entries
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

logger = logging.getLogger(__name__)


@dataclass
class _Answer:
    """A ``Quantize`` answer waiting for the steps still to come on the module it is for.

    It holds only while the module is as the answer left it: the same graph (``fingerprint``),
    no tensor replaced or written in place (``tensors``), and the generator where the answer's
    earlier steps left it (``rng_before``), since the later steps ran on the server from that
    state and those values."""

    #: The module's fingerprint once the answer's earlier steps were applied.
    fingerprint: str
    response: pb.QuantizeResponse
    #: The generator state after the last step the server ran.
    rng_state: torch.Tensor
    #: The generator state the later steps started from on the server.
    rng_before: torch.Tensor | None = None
    tensors: tuple[tuple[str, int, int], ...] = ()

    def holds_for(self, model: torch.fx.GraphModule) -> bool:
        """Whether the answer's later steps are what they would be on ``model`` now."""
        return (
            self.rng_before is not None
            and torch.equal(torch.get_rng_state(), self.rng_before)
            and _tensor_versions(model) == self.tensors
            and codec.module_fingerprint(model) == self.fingerprint
        )


def _tensor_versions(model: torch.fx.GraphModule) -> tuple[tuple[str, int, int], ...]:
    """Each parameter and buffer of ``model``: name, identity and version counter."""
    return tuple(
        (name, id(t), t._version)
        for name, t in (*model.named_parameters(), *model.named_buffers())
    )


class RemoteQuantizer(Quantizer, ServerConnection):
    """A torchao PT2E ``Quantizer`` that runs a quantizer hosted by a remote server.

    It stands wherever the hosted quantizer would: ``prepare_pt2e(model, RemoteQuantizer(...))``
    (and ``prepare_qat_pt2e``), calibration and ``convert_pt2e`` run unchanged in this
    process, which needs torch and torchao but not the backend's packages, and the prepared
    and converted modules are the same as with the local quantizer built with the same spec:
    the same graph, node names, annotations, observers and ``state_dict``, hence the same
    ``.pte`` after lowering.

    Contract of each step, as ``prepare_pt2e`` calls them back to back:

    * ``transform_for_annotation(model)`` sends ``model`` to the server once (its weights
      withheld unless a step reads them), which runs the hosted quantizer's
      ``transform_for_annotation``, ``annotate`` and ``validate`` on a copy rebuilt there; it
      applies the transform's edits to ``model`` in place (new constant buffers, ``get_attr``
      nodes, changed arguments, plain-data node metadata), checks the result's fingerprint
      against the server's, and returns ``model``. A transform that changes more than edits
      state (Arm's pass pipeline decomposes operators) comes back as its whole module, which
      is returned instead, as the local transform's module would be: its node metadata is
      what the program codec carries (no ``seq_nr``, ``from_node``), and its guards call, if
      any, calls ``model``'s own guards function.
    * ``annotate(model)`` applies what ``annotate`` did: dead code it eliminated, and every
      node's ``quantization_annotation``, rebuilt with the same sharing of spec objects and
      with observer and fake-quantize constructors resolved by name from an allow-list of
      torchao's (nothing else is accepted). Called on a module the transform answer is not
      for, or that changed since (its graph, a tensor replaced or written in place, or the
      generator drawn from in between), it asks the server for ``annotate`` and ``validate``
      alone, from the state it finds.
    * ``validate(model)`` raises what the hosted ``validate`` raised, if anything.

    A module that already carries annotations (an earlier quantizer of a
    ``ComposableQuantizer``) is refused with ``ValueError``: existing annotations do not cross
    to the server yet.

    The process's CPU generator goes with the call and comes back as each step left it (the
    XNNPACK and Core ML quantizers draw random example inputs while annotating). An exception
    the hosted quantizer raised is raised at the same step, with the same built-in class and
    message, the remote traceback chained.

    Args:
        target: any gRPC target string: ``host:port``, ``ipv4:a:p1,b:p2``, ``dns:///name:port``.
        quantizer: the hosted quantizer's name (``ListPartitioners``' ``quantizers``), e.g.
            ``"xnnpack"``.
        spec: its spec keys and values (bool, int, float, str or bytes), e.g.
            ``{"is_per_channel": True}``.
        Others: as for :class:`~remote_partitioner.client.connection.ServerConnection`.
    """

    def __init__(
        self,
        target: str,
        quantizer: str,
        spec: Mapping[str, SpecScalar] | None = None,
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        check_versions: bool = True,
        token: str | None = None,
        max_retries: int = 5,
        withhold_tensors: bool = True,
    ) -> None:
        Quantizer.__init__(self)
        ServerConnection.__init__(
            self, target, timeout=timeout, channel=channel, credentials=credentials,
            options=options, check_versions=check_versions, token=token,
            max_retries=max_retries, memoize=False, withhold_tensors=withhold_tensors,
        )
        self.quantizer_name = quantizer
        self.spec: dict[str, SpecScalar] = dict(spec or {})
        self._spec_msg = spec_entries(spec)
        self._info: pb.QuantizerInfo | None = None
        self._new_answers()

    def __repr__(self) -> str:
        return f"RemoteQuantizer({self.target!r}, {self.quantizer_name!r}, {self.spec!r})"

    def _new_answers(self) -> None:
        # module -> the answer for the steps after the one already applied; and the answer
        # whose validate step raised, until validate() raises it. Weak: a module dropped
        # between the steps takes its answer with it.
        self._pending: weakref.WeakKeyDictionary[torch.fx.GraphModule, _Answer] = (
            weakref.WeakKeyDictionary()
        )
        self._failed_validation: weakref.WeakKeyDictionary[
            torch.fx.GraphModule, pb.QuantizeResponse
        ] = weakref.WeakKeyDictionary()

    def __setstate__(self, state: dict[str, Any]) -> None:
        ServerConnection.__setstate__(self, state)
        self._new_answers()

    def __getstate__(self) -> dict[str, Any]:
        state = ServerConnection.__getstate__(self)
        state.pop("_pending", None)
        state.pop("_failed_validation", None)
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> RemoteQuantizer:
        clone = RemoteQuantizer.__new__(RemoteQuantizer)
        clone.__setstate__(self.__getstate__())
        return clone

    @property
    def info(self) -> pb.QuantizerInfo:
        """The hosted quantizer's description (fetched once).

        Raises:
            QuantizerNotFoundError: the server hosts no quantizer of this name.
        IncompatibleServerError: the server's torchao differs from this process's (and
            ``check_versions``).
        """
        if self._info is None:
            listing = self._server_listing()
            self._info = listed_entry(
                listing, listing.quantizers, self.quantizer_name, self.target, "quantizer",
                QuantizerNotFoundError, errors.Reason.UNKNOWN_QUANTIZER,
            )
            try:
                versions = self._environment_info().versions
            except RemotePartitionerError:
                self._info = None
                raise
            local = metadata.version("torchao")
            if self.check_versions and versions.torchao != local:
                self._info = None
                raise IncompatibleServerError(
                    f"server at {self.target} runs torchao {versions.torchao or '?'}, "
                    f"this client {local}: its quantizers may annotate differently "
                    "(check_versions=False to use it anyway)",
                    grpc.StatusCode.FAILED_PRECONDITION,
                )
        return self._info

    def _entry_environment(self) -> str:
        return self.info.environment

    # ------------------------------------------------------------------ the steps

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        _refuse_annotated(model)
        if self.info.loads_quantized_kernels:
            _load_quantized_kernels()
        before = torch.get_rng_state()
        response, after, table_fingerprint, sent = self._quantize(model, pb.QUANTIZE_STEPS_ALL)
        if response.raised_step == pb.QUANTIZE_STEP_TRANSFORM:
            torch.set_rng_state(after)
            exc = _raised(response)
            raise exc from exc.__cause__
        if response.HasField("transform_module"):
            model = self._replaced(model, response.transform_module, sent)
            fingerprint = response.transform_module.unlift.fingerprint
        else:
            self._apply_edits(model, response.transform_edits, table_fingerprint)
            fingerprint = response.transform_edits.fingerprint
        # The generator as the transform left it; the annotate step's state is set there.
        if response.transform_rng_state:
            set_rng_state(response.transform_rng_state)
        else:
            torch.set_rng_state(before)
        self._pending[model] = _Answer(
            fingerprint, response, after, torch.get_rng_state(), _tensor_versions(model),
        )
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        _refuse_annotated(model)
        answer = self._pending.pop(model, None)
        if answer is None or not answer.holds_for(model):
            # annotate() on its own, or the module or generator changed since the transform
            # (a draw in between, another quantizer's transform): ask for this step now.
            response, after, fingerprint, _ = self._quantize(model, pb.QUANTIZE_STEPS_ANNOTATE)
            answer = _Answer(fingerprint, response, after)
        response = answer.response
        torch.set_rng_state(answer.rng_state)
        if response.raised_step == pb.QUANTIZE_STEP_ANNOTATE:
            exc = _raised(response)
            raise exc from exc.__cause__
        self._apply_edits(model, response.annotate_edits, answer.fingerprint)
        try:
            codec.apply_annotations(model, response.annotations)
        except codec.CodecError as e:
            raise RemotePartitionerError(
                f"the server's annotations cannot be applied: {e}",
                grpc.StatusCode.INTERNAL, errors.Reason.UNREPRESENTABLE_RESULT.value,
            ) from e
        if response.raised_step == pb.QUANTIZE_STEP_VALIDATE:
            self._failed_validation[model] = answer.response  # validate raises it
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        response = self._failed_validation.pop(model, None)
        if response is not None:
            exc = _raised(response)
            raise exc from exc.__cause__

    # ------------------------------------------------------------------ plumbing

    def _quantize(
        self, model: torch.fx.GraphModule, steps: pb.QuantizeSteps
    ) -> tuple[pb.QuantizeResponse, torch.Tensor, str, codec.EncodedProgram]:
        """Send ``model`` and run ``steps`` on the server; the answer, the generator state
        after the last step that ran (the process's generator is left there), the module's
        fingerprint as sent, and the program sent."""
        self.info  # noqa: B018 - an unknown name is refused before anything is encoded
        try:
            ep, table = codec.lift_module(model)
        except codec.ProgramEncodeError as e:
            raise RemotePartitionerError(
                f"the module cannot be sent: {e}", grpc.StatusCode.INVALID_ARGUMENT,
                errors.Reason.INVALID_PROGRAM.value,
            ) from e
        ref = pb.QuantizerRef(name=self.quantizer_name, spec=self._spec_msg)

        def make(digest: pb.Digest) -> pb.QuantizeRequest:
            return pb.QuantizeRequest(
                quantizer=ref, program_digest=digest, unlift=table, steps=steps
            )

        response, sent = self._call_hook("Quantize", make, ep)
        return response, torch.get_rng_state(), table.fingerprint, sent

    def _replaced(
        self, model: torch.fx.GraphModule, replaced: pb.ReplacedModule,
        sent: codec.EncodedProgram,
    ) -> torch.fx.GraphModule:
        """The module a transform of ``model`` returned whole, rebuilt here: blobs this process
        sent are taken from what it sent, the others read from the server; its guards call
        calls ``model``'s own guards function (the server's is an inert stand-in)."""

        def blob(d: pb.Digest) -> bytes | memoryview:
            local = sent.blobs.get(d.hash)
            return local if local is not None else self._read_blob(d)

        try:
            guards = model._modules.get(codec.GUARDS_NAME)
            return codec.unlift_program(
                codec.decode_program(replaced.program, blob), replaced.unlift,
                guards_module=guards,
            )
        except codec.FingerprintMismatch as e:
            raise FingerprintMismatchError(
                f"the module the server's transform returned is rebuilt differently here: {e}",
                grpc.StatusCode.FAILED_PRECONDITION, errors.Reason.FINGERPRINT_MISMATCH.value,
            ) from e
        except codec.CodecError as e:
            raise RemotePartitionerError(
                f"the module the server's transform returned cannot be rebuilt: {e}",
                grpc.StatusCode.INTERNAL, errors.Reason.UNREPRESENTABLE_RESULT.value,
            ) from e

    def _apply_edits(
        self, model: torch.fx.GraphModule, edits: pb.GraphEdits, expected: str
    ) -> None:
        """Apply a step's edits to ``model``, whose fingerprint must be ``expected`` before
        and the edits' after."""
        try:
            codec.apply_edits(model, edits, expected=expected)
        except (codec.FingerprintMismatch, codec.EditConflict) as e:
            raise FingerprintMismatchError(
                f"the server's edits give another module here: {e}",
                grpc.StatusCode.FAILED_PRECONDITION, errors.Reason.FINGERPRINT_MISMATCH.value,
            ) from e


def _load_quantized_kernels() -> None:
    """Load ExecuTorch's quantized operators' out variants, as the hosted quantizer's own
    package does on import (Arm's): ``to_executorch`` needs them for quantize/dequantize nodes
    left outside the delegates. Without ExecuTorch's kernels (a client that only quantizes),
    nothing is loaded, as Arm's package then logs and goes on."""
    try:
        importlib.import_module("executorch.kernels.quantized")
    except ImportError:
        logger.info("executorch.kernels.quantized is not available; not loaded")


def _refuse_annotated(model: torch.fx.GraphModule) -> None:
    """Refuse a module an earlier quantizer annotated: annotations do not cross to the server,
    whose quantizer (which skips annotated nodes) would then answer differently."""
    for node in model.graph.nodes:
        if node.meta.get("quantization_annotation") is not None:
            raise ValueError(
                f"node {node.name!r} is already annotated (an earlier quantizer of a "
                "ComposableQuantizer?): RemoteQuantizer does not send existing annotations "
                "to the server; put it first, or use it alone"
            )


def _raised(response: pb.QuantizeResponse) -> BaseException:
    """The exception a hosted quantizer's step raised, rebuilt here."""
    r = response.raised
    return remote_exception(r.type, r.message, r.traceback, r.without_arguments)


__all__ = ["RemoteQuantizer"]
