"""The backends whose ``preprocess`` this server runs (the ``Preprocess`` RPC), by backend id.

A backend is an ExecuTorch ``BackendDetails`` subclass; its id is the class's name, as
``DelegationSpec.backend_id`` names it and ``to_backend`` looks it up. The built-in ones are
made by ``hosted_backends()`` in each backend family's module under ``server/backends/``
(:data:`~.registry.BUILTIN_BACKENDS`) and hosted when that module imports here; other packages add
theirs through the ``remote_partitioner.backends`` entry point group, as partitioners do
through ``remote_partitioner.partitioners`` (:mod:`remote_partitioner.server.registry`).

Plain Python: no grpc, no protobuf.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from remote_partitioner.server.registry import (
    _root_logging_kept,
    from_families,
)

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "remote_partitioner.backends"
"""Entry point group through which other packages add hosted backends. Each entry point loads
to a ``BackendDetails`` subclass, a :class:`HostedBackend`, or a zero-argument callable returning
one or a list of them."""

class UnknownBackendError(KeyError):
    """A client named a backend id the server does not host.

    Attributes:
        backend_id: The requested id.
        hosted: The hosted ids, sorted.
    """

    def __init__(self, backend_id: str, hosted: Iterable[str]) -> None:
        super().__init__(backend_id)
        self.backend_id = backend_id
        self.hosted = tuple(sorted(hosted))

    def __str__(self) -> str:
        return (
            f"this server hosts no backend {self.backend_id!r}; hosted: "
            f"{', '.join(self.hosted) or '(none)'}"
        )


@dataclass(frozen=True)
class HostedBackend:
    """A backend whose ``preprocess`` the server runs.

    Attributes:
        backend_cls: The ``BackendDetails`` subclass; its ``__name__`` is the backend id.
        description: One line for humans.
        fresh_state: Called before every preprocess (under the server's turn): puts back the
            process-wide state the backend's library keeps between calls as a fresh process
            has it, so that what one call leaves behind (a conversion that raised) does not
            change the bytes of the next, which may be another client's. None: nothing to do.
    """

    backend_cls: type
    description: str = ""
    fresh_state: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        from executorch.exir.backend.backend_details import BackendDetails

        cls = self.backend_cls
        if not (isinstance(cls, type) and issubclass(cls, BackendDetails)):
            raise TypeError(f"{self.backend_cls!r} is not a BackendDetails subclass")

    @property
    def backend_id(self) -> str:
        """The backend id (the class's name)."""
        return self.backend_cls.__name__

    @property
    def module(self) -> str:
        """The module that defines the class."""
        return self.backend_cls.__module__


class BackendRegistry:
    """The hosted backends, by unique backend id."""

    def __init__(self, hosted: Iterable[HostedBackend] = ()) -> None:
        self._hosted: dict[str, HostedBackend] = {}
        for h in hosted:
            self.register(h)

    def register(self, hosted: HostedBackend) -> None:
        """Add a backend; ValueError if its id is taken."""
        if hosted.backend_id in self._hosted:
            raise ValueError(f"a backend {hosted.backend_id!r} is already registered")
        self._hosted[hosted.backend_id] = hosted

    def ids(self) -> list[str]:
        """The hosted backend ids, sorted."""
        return sorted(self._hosted)

    def get(self, backend_id: str) -> HostedBackend:
        """The backend ``backend_id``; raises :class:`UnknownBackendError`."""
        try:
            return self._hosted[backend_id]
        except KeyError:
            raise UnknownBackendError(backend_id, self._hosted) from None

    def __iter__(self) -> Iterator[HostedBackend]:
        return iter([self._hosted[i] for i in self.ids()])

    def __len__(self) -> int:
        return len(self._hosted)

    def __contains__(self, backend_id: object) -> bool:
        return backend_id in self._hosted


def _hosted(obj: object) -> list[HostedBackend]:
    """An entry point's object as hosted backends (TypeError for anything else)."""
    if isinstance(obj, type):
        return [HostedBackend(obj, (obj.__doc__ or "").strip().split("\n")[0])]
    if isinstance(obj, HostedBackend):
        return [obj]
    if callable(obj):
        made = obj()
        items = list(made) if isinstance(made, (list, tuple)) else [made]
        out: list[HostedBackend] = []
        for item in items:
            if isinstance(item, HostedBackend):
                out.append(item)
            elif isinstance(item, type):
                out.extend(_hosted(item))
            else:
                raise TypeError(f"expected HostedBackend, got {type(item).__name__}")
        return out
    raise TypeError(f"expected a BackendDetails subclass, got {type(obj).__name__}")


def builtin_backends(only: Iterable[str] | None = None) -> list[HostedBackend]:
    """The built-in backends whose module imports here: each family module's
    ``hosted_backends()``, for the families ``only`` names (default every one;
    :func:`~.registry.from_families`: one that cannot be imported here is left out and logged,
    never raised)."""
    return from_families("hosted_backends", "backend", only)


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[HostedBackend]:
    """The backends installed packages declare in ``group``; one that fails to load or is not
    a backend is logged as a warning and skipped."""
    hosted: list[HostedBackend] = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            with _root_logging_kept():
                hosted.extend(_hosted(ep.load()))
        except Exception as e:
            logger.warning(
                "skipping backend plugin %s = %s: %s: %s", ep.name, ep.value, type(e).__name__, e
            )
    return hosted


def default_backend_registry(
    *, plugins: bool = True, only: Iterable[str] | None = None
) -> BackendRegistry:
    """The built-in backends (of the families ``only`` names, default all) and, if
    ``plugins``, the entry points' (a plugin whose id is taken is logged and skipped)."""
    registry = BackendRegistry(builtin_backends(only))
    if plugins:
        for hosted in load_entry_points():
            if hosted.backend_id in registry:
                logger.warning("skipping plugin backend %r: id already taken", hosted.backend_id)
            else:
                registry.register(hosted)
    return registry


__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendRegistry",
    "HostedBackend",
    "UnknownBackendError",
    "default_backend_registry",
]
