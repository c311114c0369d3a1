"""Noticing, exactly, when a hosted hook reads the values of a tensor the client withheld.

A client may send a program whose parameters, buffers and constants carry only metadata
(``TensorRef.withheld``): the server rebuilds each of them as a ``FakeTensor`` of a fake mode
of its own (:class:`WithheldFakeMode`) and runs the hook on that program inside
:func:`watching`. The hook's answer is kept only if it never touched a withheld tensor other
than to read its metadata; otherwise the server asks the client for the real bytes and runs the
hook again on the real program (``TENSOR_DATA_REQUIRED``), so the answer always equals the one
the local partitioner gives. A lowered module whose original program the client withheld
(``LoweredModule.original_withheld``) is rebuilt by :func:`withheld_lowered_module_class`: the
first read of that program is recorded in the same watch.

Two layers see every use of a withheld tensor, so that a hook that catches the exception a
value read raises (``DataDependentOutputException``, ``RuntimeError`` from ``.numpy()``) is
still noticed:

* a ``TorchFunctionMode`` sees every Python-level call with a withheld tensor among its
  arguments (methods, properties, ``torch.*`` functions), including the calls that never reach
  the dispatcher: ``data_ptr()`` and ``untyped_storage()`` (which a ``FakeTensor`` answers
  with 0 and a storage of no data), ``numpy()``, ``tolist()``, ``repr()``. Only the calls in
  :data:`METADATA_CALLS` (shape, dtype, strides, ...) are allowed;
* :class:`WithheldFakeMode` sees every operator dispatched on a withheld tensor, even under
  ``torch._C.DisableTorchFunction``: any such operator counts as a use.

Any other operation on a withheld tensor is a use too (a copy, a view, arithmetic): its result
could carry the values into the answer. What cannot be seen is Python-level identity and type
(``t is u``, ``isinstance(t, FakeTensor)``): those read no value, but a hook that branches on
whether a tensor is a ``FakeTensor`` could answer differently; the tensor types a local hook
sees are documented in docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = [
    "METADATA_CALLS",
    "TensorDataRequired",
    "ValueReads",
    "Withheld",
    "WithheldFakeMode",
    "is_watching",
    "is_withheld",
    "mark_withheld",
    "watching",
    "withheld_lowered_module_class",
]

#: The attribute that marks a tensor rebuilt from a withheld ``TensorRef`` (its name).
_MARK = "_remote_partitioner_withheld"

_PROPERTIES = (
    "shape", "dtype", "device", "requires_grad", "is_leaf", "ndim", "layout", "is_quantized",
    "is_sparse", "is_cuda", "is_cpu", "is_mkldnn", "is_nested", "names", "grad_fn",
    "is_meta", "_version",
)
_METHODS = (
    "size", "stride", "dim", "ndimension", "numel", "nelement", "element_size",
    "storage_offset", "is_contiguous", "is_floating_point", "is_complex", "is_signed",
    "get_device", "__len__", "__hash__", "is_inference", "has_names",
)


def _metadata_calls() -> frozenset[Any]:
    calls: set[Any] = set()
    for name in _PROPERTIES:
        prop = getattr(torch.Tensor, name, None)
        getter = getattr(prop, "__get__", None)
        if getter is not None:
            calls.add(getter)
    for name in _METHODS:
        method = getattr(torch.Tensor, name, None)
        if method is not None:
            calls.add(method)
    return frozenset(calls)


#: The calls that read only a tensor's metadata: allowed on a withheld tensor.
METADATA_CALLS = _metadata_calls()


def mark_withheld(t: torch.Tensor, name: str) -> torch.Tensor:
    """Mark ``t`` as the stand-in for withheld tensor ``name``; returns ``t``."""
    setattr(t, _MARK, name)
    return t


def is_withheld(x: object) -> bool:
    """Whether ``x`` is a tensor marked by :func:`mark_withheld`."""
    return isinstance(x, torch.Tensor) and _MARK in getattr(x, "__dict__", {})


class ValueReads:
    """What one watched hook did with what the client withheld: the first use of a withheld
    tensor that was not metadata, or the first read of a withheld lowered program."""

    def __init__(self) -> None:
        #: The withheld tensor's name, or the lowered module's.
        self.tensor: str | None = None
        self.operation: str | None = None
        #: What :attr:`tensor` names: "tensor" or "lowered module".
        self.kind = "tensor"

    def __bool__(self) -> bool:
        return self.tensor is not None

    def record(self, tensor: str, operation: str, kind: str = "tensor") -> None:
        if self.tensor is None:
            self.tensor, self.operation, self.kind = tensor, operation, kind

    def describe(self) -> str:
        return f"{self.operation} on {self.kind} {self.tensor!r}"


_local = threading.local()


def _active() -> ValueReads | None:
    return getattr(_local, "reads", None)


def _withheld_in(args: Any, kwargs: Any) -> str | None:
    for x in pytree.tree_leaves((args, kwargs or {})):
        if is_withheld(x):
            return str(x.__dict__[_MARK])
    return None


def _name(func: Any) -> str:
    owner = getattr(func, "__objclass__", None) or getattr(func, "__self__", None)
    name = getattr(func, "__name__", None) or str(func)
    if owner is not None and isinstance(owner, type):
        return f"{owner.__name__}.{name}"
    return str(name)


class WithheldFakeMode(FakeTensorMode):
    """The fake mode of the tensors rebuilt from withheld ``TensorRef`` s: while a hook is
    watched (:func:`watching`), every operator dispatched on them is recorded as a use."""

    def __torch_dispatch__(  # type: ignore[override]
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        reads = _active()
        if reads is not None:
            tensor = _withheld_in(args, kwargs)
            if tensor is not None:
                reads.record(tensor, str(func))
        return super().__torch_dispatch__(func, types, args, kwargs)


class Withheld:
    """How the codec rebuilds one program's withheld tensors on this server
    (``codec.WithheldTensors``): fakes of a :class:`WithheldFakeMode` of their own, marked."""

    def __init__(self) -> None:
        self.fake_mode = WithheldFakeMode()

    def mark(self, t: torch.Tensor, name: str) -> torch.Tensor:
        return mark_withheld(t, name)

    def lowered_module(self, name: str, backend_id: str, compile_specs: list[Any]) -> Any:
        return withheld_lowered_module_class()(name, backend_id, compile_specs)


class TensorDataRequired(Exception):
    """Raised by a hook's server-side code (not the hosted hook) that cannot answer without
    the tensors' data, e.g. a transform that returned a new program; and by a withheld
    lowered module's original program when read."""


@functools.cache
def withheld_lowered_module_class() -> type:
    """The class of the stand-ins for lowered modules whose original programs the client
    withheld (``LoweredModule.original_withheld``): a ``LoweredBackendModule`` (with empty
    processed bytes, as every lowered module that crosses) whose original program, read
    through ``original_module`` or the attribute behind it (as ``program()``, deep copies and
    the serializers read it), records the read in the watch and raises
    :class:`TensorDataRequired`. A hook that swallows the exception is still noticed."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    class WithheldLoweredModule(LoweredBackendModule):  # type: ignore[misc]
        def __init__(self, name: str, backend_id: str, compile_specs: list[Any]) -> None:
            super().__init__(None, backend_id, b"", compile_specs)  # type: ignore[arg-type]
            self._withheld_name = name

        @property  # type: ignore[override]
        def _original_exported_program(self) -> Any:
            reads = _active()
            if reads is not None:
                reads.record(self._withheld_name, "reading the original program",
                             kind="lowered module")
            raise TensorDataRequired(
                f"the original program of lowered module {self._withheld_name!r} was withheld"
            )

        @_original_exported_program.setter
        def _original_exported_program(self, value: Any) -> None:
            if value is not None:  # only LoweredBackendModule.__init__ sets it, to None here
                raise AttributeError("a withheld lowered module's program cannot be set")

    return WithheldLoweredModule


def is_watching() -> bool:
    """Whether a hook is being watched in this thread (its program withholds tensors)."""
    return _active() is not None


class _Watch(TorchFunctionMode):
    def __init__(self, reads: ValueReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if func not in METADATA_CALLS:
            tensor = _withheld_in(args, kwargs)
            if tensor is not None:
                self.reads.record(tensor, _name(func))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def watching() -> Iterator[ValueReads]:
    """Watch the body's uses of withheld tensors (in this thread); yields what it records."""
    reads = ValueReads()
    previous = _active()
    _local.reads = reads
    try:
        with _Watch(reads):
            yield reads
    finally:
        _local.reads = previous
