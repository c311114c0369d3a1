"""Decoding: ``Program`` message and its blobs -> ``ExportedProgram``.

:class:`Decoder` rebuilds tensors from blobs (sharing storages as the client's did), the graph
through :mod:`~remote_partitioner.proto.codec.deserializers`, repairs it
(:mod:`~remote_partitioner.proto.codec.repair`) and checks it against the client's fingerprint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.deserializers import deserialize_aten, deserialize_edge
from remote_partitioner.proto.codec.fingerprint import fingerprint, first_difference
from remote_partitioner.proto.codec.repair import repair, restore_metadata, restore_symbol_hints
from remote_partitioner.proto.codec.verifiers import edge_verifier_class
from remote_partitioner.proto.program_errors import (
    BlobSizeMismatch,
    CodecError,
    FingerprintMismatch,
    ProgramDecodeError,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["Decoder", "WithheldTensors", "decode_program"]


class WithheldTensors(Protocol):
    """How a decoder rebuilds the tensors a client withheld (``TensorRef.withheld``): as
    ``FakeTensor`` s of :attr:`fake_mode` sharing storage as the client's did, each passed
    through :meth:`mark` (the server's watch of how a hook uses them)."""

    @property
    def fake_mode(self) -> Any:
        """The ``FakeTensorMode`` the withheld tensors belong to."""

    def mark(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """``t``, the stand-in for withheld tensor ``name``, as it goes into the program."""

    def lowered_module(self, name: str, backend_id: str, compile_specs: list[Any]) -> Any:
        """The stand-in for lowered module ``name`` whose original program was withheld
        (``LoweredModule.original_withheld``): a ``LoweredBackendModule`` with that backend
        id and those compile specs whose original program cannot be read unnoticed."""


_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype)
}


#: The quantized dtypes: the encoder refuses quantized tensors, and torch cannot fake them.
_QUANTIZED = frozenset([torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4])
#: torch counts a tensor's elements in an int64.
_MAX_NUMEL = 2**63 - 1


def _dtype(ref: pb.TensorRef) -> torch.dtype:
    """The dtype ``ref`` names; :class:`ProgramDecodeError` if none, or a quantized one."""
    dtype = _DTYPES.get(ref.dtype)
    if dtype is None:
        raise ProgramDecodeError(f"tensor {ref.name!r}: unknown dtype {ref.dtype!r}")
    if dtype in _QUANTIZED:
        raise ProgramDecodeError(
            f"tensor {ref.name!r}: quantized tensors ({ref.dtype}) cannot cross the wire"
        )
    return dtype


def _check_numel(ref: pb.TensorRef, sizes: list[int]) -> None:
    """:class:`ProgramDecodeError` if torch cannot count the elements of ``sizes``. (For a
    real tensor, checked after its storage: a tensor reaching beyond it is named so.)"""
    if math.prod(sizes) > _MAX_NUMEL:
        raise ProgramDecodeError(
            f"tensor {ref.name!r}: sizes {sizes} hold more elements than torch can count"
        )


def _check_extent(
    ref: pb.TensorRef, dtype: torch.dtype, sizes: list[int], strides: list[int], nbytes: int
) -> None:
    """:class:`ProgramDecodeError` if the tensor would reach beyond a storage of ``nbytes``."""
    if math.prod(sizes):
        last = ref.storage_offset + sum((s - 1) * st for s, st in zip(sizes, strides, strict=True))
        if any(st < 0 for st in strides) or (last + 1) * dtype.itemsize > nbytes:
            raise ProgramDecodeError(
                f"tensor {ref.name!r} reaches beyond its storage of {nbytes} bytes"
            )


def _check_shape(ref: pb.TensorRef, sizes: list[int], strides: list[int]) -> None:
    """:class:`ProgramDecodeError` unless these sizes, strides and offset are well-formed (the
    element count and storage are checked as the tensor is built)."""
    if len(sizes) != len(strides) or any(s < 0 for s in sizes) or ref.storage_offset < 0:
        raise ProgramDecodeError(f"tensor {ref.name!r}: malformed sizes or strides")


def _codec_error_in(e: BaseException) -> CodecError | None:
    """The first :class:`CodecError` among the causes of ``e``, if any."""
    seen: set[int] = set()
    cause = e.__cause__ or e.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, CodecError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class Decoder:
    """Rebuilds the program of one message and its lowered modules' original programs, which
    share the storages and tensors they have in common: one instance per message."""

    def __init__(
        self,
        blobs: Callable[[pb.Digest], bytes | bytearray | memoryview],
        withheld: WithheldTensors | None = None,
    ) -> None:
        self._get_blob = blobs
        self._withheld = withheld
        self._storages: dict[str, torch.UntypedStorage] = {}
        # withheld storage number -> its fake storage
        self._withheld_storages: dict[int, torch.UntypedStorage] = {}
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = {}

    def blob(self, digest: pb.Digest) -> bytes | bytearray | memoryview:
        """The bytes of blob ``digest``: :class:`BlobMissing` (from the getter) if there are
        none, :class:`BlobSizeMismatch` if their size is not the digest's."""
        data = self._get_blob(digest)
        if memoryview(data).nbytes != digest.size_bytes:
            raise BlobSizeMismatch(
                f"blob {digest.hash} holds {memoryview(data).nbytes} bytes, "
                f"the program declares {digest.size_bytes}"
            )
        return data

    def storage(self, digest: pb.Digest) -> torch.UntypedStorage:
        """The storage of blob ``digest``, one per blob: the blob's memory if it is writable,
        a copy if it is read-only."""
        s = self._storages.get(digest.hash)
        if s is None:
            view = memoryview(self.blob(digest)).cast("B")
            if view.nbytes == 0:
                s = torch.UntypedStorage(0)
            else:
                # A writable buffer is shared (zero-copy); a read-only one is copied, since
                # tensors are writable.
                buf = bytearray(view) if view.readonly else view
                s = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
            self._storages[digest.hash] = s
        return s

    def tensor(self, ref: pb.TensorRef, fake_mode: Any = None) -> torch.Tensor:
        """The tensor ``ref`` describes: a view of its storage's blob (one tensor object per
        distinct real ``ref``; tensors with one storage share it), or, if ``ref.fake``, a new
        ``FakeTensor`` of ``fake_mode``; a ``Parameter`` if ``ref.is_parameter``.

        Raises:
            ProgramDecodeError: ``ref`` describes what torch cannot build (checked before
                torch sees it), or a fake tensor with no ``fake_mode``.
            BlobMissing, BlobSizeMismatch: as :meth:`blob`.
        """
        dtype = _dtype(ref)
        sizes, strides = list(ref.sizes), list(ref.strides)
        _check_shape(ref, sizes, strides)
        storage_key = ("withheld", ref.withheld_storage) if ref.withheld else ref.storage.hash
        key = (storage_key, ref.dtype, tuple(sizes), tuple(strides), ref.storage_offset,
               ref.fake, ref.is_parameter, ref.requires_grad)
        if not ref.fake and key in self._tensors:
            return self._tensors[key]
        if ref.withheld:
            t = self._withheld_view(ref, dtype, sizes, strides)
        elif ref.fake:
            if fake_mode is None:
                raise ProgramDecodeError(
                    f"tensor {ref.name!r} is fake but the graph has no fake mode"
                )
            _check_numel(ref, sizes)
            with fake_mode:
                t = torch.empty_strided(sizes, strides, dtype=dtype, device="cpu")
        else:
            t = self._view(ref, dtype, sizes, strides)
        if ref.is_parameter:
            if ref.requires_grad and not (dtype.is_floating_point or dtype.is_complex):
                raise ProgramDecodeError(
                    f"tensor {ref.name!r}: a parameter of dtype {ref.dtype} cannot require "
                    "gradients"
                )
            t = torch.nn.Parameter(t, requires_grad=ref.requires_grad)
        elif ref.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        if ref.withheld:
            assert self._withheld is not None  # (_withheld_view checked)
            t = self._withheld.mark(t, ref.name)
        if not ref.fake:
            self._tensors[key] = t
        return t

    def _view(
        self, ref: pb.TensorRef, dtype: torch.dtype, sizes: list[int], strides: list[int]
    ) -> torch.Tensor:
        """A real tensor on its storage's blob; :class:`ProgramDecodeError` if it has none or
        would reach beyond it."""
        if not ref.HasField("storage"):
            raise ProgramDecodeError(f"tensor {ref.name!r} has no storage")
        storage = self.storage(ref.storage)
        _check_extent(ref, dtype, sizes, strides, storage.nbytes())
        _check_numel(ref, sizes)
        return torch.empty(0, dtype=dtype).set_(storage, ref.storage_offset, sizes, strides)  # type: ignore[call-overload]

    def _withheld_view(
        self, ref: pb.TensorRef, dtype: torch.dtype, sizes: list[int], strides: list[int]
    ) -> torch.Tensor:
        """The stand-in for a withheld tensor: a ``FakeTensor`` of the withheld fake mode on
        the fake storage its number names (tensors naming one number share it).

        Raises:
            ProgramDecodeError: no withheld mode was given (this call needs tensor data), the
                ref also names a storage or is fake, its storage number was declared with
                another size, or it reaches beyond that storage.
        """
        if self._withheld is None:
            raise ProgramDecodeError(
                f"tensor {ref.name!r} is withheld; this call needs the tensors' data"
            )
        if ref.HasField("storage") or ref.fake:
            raise ProgramDecodeError(
                f"tensor {ref.name!r} is withheld and also names a storage or is fake"
            )
        nbytes = ref.withheld_storage_bytes
        if nbytes < 0:
            raise ProgramDecodeError(f"tensor {ref.name!r}: negative withheld_storage_bytes")
        _check_extent(ref, dtype, sizes, strides, nbytes)
        _check_numel(ref, sizes)
        mode = self._withheld.fake_mode
        storage = self._withheld_storages.get(ref.withheld_storage)
        if storage is None:
            with mode:
                storage = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
            self._withheld_storages[ref.withheld_storage] = storage
        elif storage.nbytes() != nbytes:
            raise ProgramDecodeError(
                f"tensor {ref.name!r}: withheld storage {ref.withheld_storage} is declared "
                f"with {nbytes} bytes here and {storage.nbytes()} bytes before"
            )
        with mode:
            return torch.empty(0, dtype=dtype).set_(  # type: ignore[call-overload,no-any-return]
                storage, ref.storage_offset, sizes, strides
            )

    def withheld_lowered_module(self, m: pb.LoweredModule, compile_specs: list[Any]) -> Any:
        """The stand-in for lowered module ``m``, whose original program was withheld.

        Raises:
            ProgramDecodeError: no withheld mode was given (this call needs the program whole),
                or ``m`` also carries its original program.
        """
        if self._withheld is None:
            raise ProgramDecodeError(
                f"lowered module {m.name!r} withholds its original program; this call needs it"
            )
        if m.HasField("original_program"):
            raise ProgramDecodeError(
                f"lowered module {m.name!r} withholds its original program and also carries it"
            )
        return self._withheld.lowered_module(m.name, m.backend_id, compile_specs)

    def program(self, msg: pb.Program) -> ExportedProgram:
        """The program ``msg`` describes, repaired and checked against its fingerprint.

        Raises:
            CodecError: as :func:`decode_program`; other exceptions are failures this decoder
                did not anticipate (:func:`decode_program` turns them into
                :class:`ProgramDecodeError`).
        """
        from torch._guards import detect_fake_mode

        if msg.dialect not in (pb.DIALECT_ATEN, pb.DIALECT_EDGE):
            raise ProgramDecodeError("the program's dialect is not set")
        if not msg.HasField("graph"):
            raise ProgramDecodeError("the program has no graph")
        raw = bytes(self.blob(msg.graph))
        real_state = {r.name: self.tensor(r) for r in msg.state_dict if not r.fake}
        constants = {r.name: self.tensor(r) for r in msg.constants}
        fakes = [r for r in msg.state_dict if r.fake]
        # Placeholders for fake parameters until the graph's fake mode is known.
        state_dict: dict[str, torch.Tensor] = {}
        for r in msg.state_dict:
            state_dict[r.name] = real_state[r.name] if not r.fake else torch.empty(0)
        lowered = {(m.module_path, m.name): m for m in msg.lowered_modules}
        module_tensors = {(m.module_path, m.tensor.name): m.tensor for m in msg.module_tensors}
        try:
            if msg.dialect == pb.DIALECT_EDGE:
                ep = deserialize_edge(raw, state_dict, constants, lowered, module_tensors, self)
            else:
                ep = deserialize_aten(raw, state_dict, constants)
        except CodecError:
            raise
        except Exception as e:
            # The serializer wraps what our hooks in it raise ("Failed deserializing node"):
            # the hook's own error says what is wrong. (Raised as it is: it is among the
            # causes of ``e`` already.)
            cause = _codec_error_in(e)
            if cause is not None:
                raise cause  # noqa: B904
            raise ProgramDecodeError(
                f"the program's graph cannot be deserialized: {type(e).__name__}: {e}"
            ) from e
        if fakes:
            fake_mode = detect_fake_mode(
                tuple(n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder")
            )
            for r in fakes:
                ep._state_dict[r.name] = self.tensor(r, fake_mode)
        restore_symbol_hints(ep)
        repair(ep, list(msg.fingerprint))
        problem = first_difference(msg.fingerprint, fingerprint(ep))
        if problem is not None:
            raise FingerprintMismatch(f"the program rebuilt on the server differs: {problem}")
        restore_metadata(ep, msg)
        if msg.HasField("edge_verifier"):
            if msg.dialect != pb.DIALECT_EDGE:
                raise ProgramDecodeError("an ATen program cannot carry an Edge verifier")
            ep._verifiers = [edge_verifier_class(msg.edge_verifier)]
        return ep


def decode_program(
    msg: pb.Program,
    blobs: Callable[[pb.Digest], bytes | bytearray | memoryview],
    *,
    withheld: WithheldTensors | None = None,
) -> ExportedProgram:
    """Rebuild the ExportedProgram a Program message describes.

    Args:
        msg: The program message.
        blobs: Returns a blob's bytes by digest; raises :class:`BlobMissing` if it has none.
            The tensors of a writable buffer share its memory (no copy is made: the caller
            must not reuse it for anything else); a read-only buffer is copied.
        withheld: How to rebuild withheld tensors (``TensorRef.withheld``); without it a
            withheld tensor is a :class:`ProgramDecodeError`.

    Raises:
        BlobMissing: a blob the program names is not available.
        ProgramDecodeError: the message or its graph cannot be decoded.
        FingerprintMismatch: the rebuilt program differs from the client's fingerprint.
    """
    try:
        return Decoder(blobs, withheld).program(msg)
    except CodecError:
        raise
    except Exception as e:
        # A last resort, so that a caller sees only the errors above: the decoder checks what
        # it knows torch refuses, and anything else reaching here is a failure it did not
        # anticipate (tests/test_fuzz.py calls Decoder without this, to find them).
        raise ProgramDecodeError(
            f"the program cannot be rebuilt: {type(e).__name__}: {str(e)[:1000]}"
        ) from e
