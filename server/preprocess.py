"""Runs a hosted backend's ``preprocess`` on decoded programs (the ``Preprocess`` RPC).

The server's half of ``BackendDetails`` (``executorch/exir/backend/backend_details.py``): the
programs arrive decoded by the codec, with the node metadata the partitioner wrote applied;
this module calls ``preprocess`` (one program) or ``preprocess_multimethod`` (programs by
method), exactly as ``to_backend`` would in the client's process, and checks the shape of the
answer. Plain Python: no grpc.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from remote_partitioner.server.hooks import PartitionerRaised

#: One method's partitions: (program, compile specs) in order.
MethodPrograms = tuple[str, Sequence[tuple[ExportedProgram, list[CompileSpec]]]]


def run(
    backend_cls: Any, methods: Sequence[MethodPrograms], multimethod: bool,
    fresh_state: Callable[[], None] | None = None,
) -> list[tuple[str, list[Any]]]:
    """The backend's ``PreprocessResult`` s, by method, one per program in order.

    ``multimethod`` False: ``backend_cls.preprocess(program, compile_specs)`` on the one program
    (the caller checks there is one). True: ``backend_cls.preprocess_multimethod`` on all.
    ``fresh_state`` (the hosted backend's, see ``HostedBackend``) runs first.

    Raises:
        PartitionerRaised: the backend raised, or answered with the wrong number of results.
    """
    try:
        if fresh_state is not None:
            fresh_state()
        if not multimethod:
            ((name, [(program, specs)]),) = methods
            return [(name, [backend_cls.preprocess(program, specs)])]
        programs = {name: [p for p, _ in items] for name, items in methods}
        specs_by_method = {name: [s for _, s in items] for name, items in methods}
        results = backend_cls.preprocess_multimethod(programs, specs_by_method)
    except Exception as e:
        raise PartitionerRaised(e) from e
    out: list[tuple[str, list[Any]]] = []
    for name, items in methods:
        got = list((results or {}).get(name, []))
        if len(got) != len(items):
            raise PartitionerRaised(RuntimeError(
                f"{backend_cls.__name__}.preprocess_multimethod returned {len(got)} results for "
                f"method {name!r}, which has {len(items)} programs"
            ))
        out.append((name, got))
    return out


__all__ = ["MethodPrograms", "run"]
