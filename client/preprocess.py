"""Remote preprocess: the ``BackendDetails`` that ``to_backend`` finds for a backend id runs its
``preprocess`` on the server.

``to_backend`` looks a backend up by name among ``BackendDetails.__subclasses__()`` and calls
its ``preprocess`` (one program) or ``preprocess_multimethod`` (the partitions of every method).
Two cases lead here:

* The backend cannot be imported in this process (no SDK, no backend package): :func:`install`
  defines, once per backend id and process, a stand-in ``BackendDetails`` subclass *named* like
  the backend id whose two entry points call the server.
* The backend is importable but the user asked for ``remote_preprocess=True``: :func:`install`
  wraps the real class's ``preprocess`` and ``preprocess_multimethod`` once; the wrappers call
  the server only when a route (below) exists, and the backend's own code otherwise, so local
  lowerings in the same process are untouched.

Which server: a *route* maps a backend id to the :class:`~remote_partitioner.client.remote.
RemotePartitioner` (or the client of :func:`~remote_partitioner.client.lower.to_backend_remotely`)
whose connection preprocess uses. It is found, in order:

1. in the current context (:func:`scoped_route`, used by the whole-program helper);
2. among the partitioners that the ExecuTorch frames calling us hold (``to_backend``'s
   ``partitioner_instance`` / ``method_to_partitioner``): the innermost one whose last
   ``partition()`` routed that backend id. Two ``RemotePartitioner``s thus each use their own
   server, and a local partitioner's lowering never goes remote;
3. for a stand-in only: the partitioner that routed the backend id last (still alive).

Without a route, a stand-in hands over to the real class when one has been imported since, and
raises otherwise; a wrapped real class runs locally.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

__all__ = ["Preprocessor", "backend_class", "install", "route_for", "scoped_route"]


class Preprocessor(Protocol):
    """What runs preprocess remotely: a ``RemotePartitioner``."""

    def routes_backend(self, backend_id: str) -> bool:
        """Whether this object's last partition routed ``backend_id`` to the server."""

    def remote_preprocess_multimethod(
        self,
        backend_id: str,
        programs: Mapping[str, list[Any]],
        compile_specs: Mapping[str, list[list[Any]]],
        multimethod: bool,
    ) -> dict[str, list[Any]]:
        """The backend's ``PreprocessResult`` s, computed on the server."""


_lock = threading.RLock()
#: backend id -> the stand-in class defined for it (one per id and process).
_stand_ins: dict[str, type] = {}
#: ids of real classes whose entry points were wrapped.
_wrapped: set[str] = set()
#: backend id -> the preprocessor that routed it last (stand-ins' fallback).
_last: dict[str, weakref.ref[Any]] = {}
_scoped: contextvars.ContextVar[Mapping[str, Preprocessor] | None] = contextvars.ContextVar(
    "remote_partitioner_preprocess_route", default=None
)
#: Frames of these modules are searched for the partitioners in use.
_EXECUTORCH_PREFIX = "executorch.exir"


def backend_class(backend_id: str, *, real: bool = False) -> type | None:
    """The ``BackendDetails`` subclass ``to_backend`` finds first for ``backend_id`` (with
    ``real``: the first that is not a stand-in), or None."""
    from executorch.exir.backend.backend_details import BackendDetails

    for cls in BackendDetails.__subclasses__():
        if cls.__name__ == backend_id and not (real and cls in _stand_ins.values()):
            return cls
    return None


@contextlib.contextmanager
def scoped_route(backend_id: str, preprocessor: Preprocessor) -> Iterator[None]:
    """Route ``backend_id`` to ``preprocessor`` within the body (this context only)."""
    token = _scoped.set({**(_scoped.get() or {}), backend_id: preprocessor})
    try:
        yield
    finally:
        _scoped.reset(token)


def _partitioners_in(value: Any, depth: int = 2) -> Iterator[Any]:
    if hasattr(value, "routes_backend"):
        yield value
    elif depth and isinstance(value, dict):
        for v in value.values():
            yield from _partitioners_in(v, depth - 1)
    elif depth and isinstance(value, (list, tuple)):
        for v in value:
            yield from _partitioners_in(v, depth - 1)


def _on_stack(backend_id: str) -> Preprocessor | None:
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_EXECUTORCH_PREFIX):
            for value in frame.f_locals.values():
                for p in _partitioners_in(value):
                    if p.routes_backend(backend_id):
                        return p  # type: ignore[no-any-return]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def route_for(backend_id: str, *, fallback: bool = False) -> Preprocessor | None:
    """The preprocessor that runs ``backend_id`` (see the module docstring), or None."""
    scoped = _scoped.get()
    if scoped is not None and backend_id in scoped:
        return scoped[backend_id]
    found = _on_stack(backend_id)
    if found is None and fallback:
        with _lock:
            ref = _last.get(backend_id)
        found = ref() if ref is not None else None
    return found


def install(backend_id: str, preprocessor: Preprocessor | None, *, wrap_real: bool) -> None:
    """Make ``to_backend``'s lookup of ``backend_id`` reach the server when routed.

    With ``wrap_real`` and a real class present, wrap its entry points; otherwise, when no
    class of that name exists, define the stand-in. ``preprocessor`` becomes the stand-in's
    fallback route.
    """
    with _lock:
        if preprocessor is not None:
            _last[backend_id] = weakref.ref(preprocessor)
        real = backend_class(backend_id, real=True)
        if real is not None:
            if wrap_real and backend_id not in _wrapped:
                _wrap(real)
                _wrapped.add(backend_id)
            return
        if backend_id not in _stand_ins:
            _stand_ins[backend_id] = _define_stand_in(backend_id)


def _remote(
    p: Preprocessor, backend_id: str, edge_program: Any, compile_specs: list[Any]
) -> Any:
    out = p.remote_preprocess_multimethod(
        backend_id, {"forward": [edge_program]}, {"forward": [compile_specs]}, False
    )
    return out["forward"][0]


def _define_stand_in(backend_id: str) -> type:
    from executorch.exir.backend.backend_details import BackendDetails

    def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
        p = route_for(backend_id, fallback=True)
        if p is not None:
            return _remote(p, backend_id, edge_program, compile_specs)
        real: Any = _real_or_raise(backend_id)
        return real.preprocess(edge_program, compile_specs)

    def preprocess_multimethod(
        cls: type, edge_programs: dict[str, list[Any]], compile_specs: dict[str, list[list[Any]]]
    ) -> dict[str, list[Any]]:
        p = route_for(backend_id, fallback=True)
        if p is not None:
            return p.remote_preprocess_multimethod(backend_id, edge_programs, compile_specs, True)
        real: Any = _real_or_raise(backend_id)
        return real.preprocess_multimethod(edge_programs, compile_specs)  # type: ignore[no-any-return]

    return type(backend_id, (BackendDetails,), {
        "__module__": __name__,
        "__doc__": f"Stand-in for backend {backend_id!r}: its preprocess runs on the server.",
        "preprocess": staticmethod(preprocess),
        "preprocess_multimethod": classmethod(preprocess_multimethod),
    })


def _real_or_raise(backend_id: str) -> type:
    real = backend_class(backend_id, real=True)
    if real is None:
        raise NotImplementedError(
            f"backend {backend_id!r} cannot be imported in this process and no "
            "RemotePartitioner routes it to a server: lower with a RemotePartitioner, or "
            "with remote_partitioner.client.to_backend_remotely"
        )
    return real


def _wrap(real: Any) -> None:
    backend_id = real.__name__
    local_preprocess = real.preprocess  # the function (a staticmethod, read off the class)
    local_multimethod = real.preprocess_multimethod  # bound to the class

    def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
        p = route_for(backend_id)
        if p is not None:
            return _remote(p, backend_id, edge_program, compile_specs)
        return local_preprocess(edge_program, compile_specs)

    def preprocess_multimethod(
        cls: type, edge_programs: dict[str, list[Any]], compile_specs: dict[str, list[list[Any]]]
    ) -> dict[str, list[Any]]:
        p = route_for(backend_id)
        if p is not None:
            return p.remote_preprocess_multimethod(backend_id, edge_programs, compile_specs, True)
        return local_multimethod(edge_programs, compile_specs)  # type: ignore[no-any-return]

    real.preprocess = staticmethod(preprocess)
    real.preprocess_multimethod = classmethod(preprocess_multimethod)
