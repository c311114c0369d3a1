"""The caller's random generator: a hook, preprocess or quantizer step runs with the server's
default CPU generator set to the state the client sent (``rng_state`` in the request), so it
draws what it would have drawn in the client's process, and the state it leaves goes back.

Used only under the process's one hook turn (``PartitionerInstance.turn``): nothing else
uses the generator between setting the caller's state and reading it back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from remote_partitioner.proto.errors import Reason, ServiceError


def parse(raw: bytes) -> torch.Tensor | None:
    """The caller's CPU generator state from a hook request's ``rng_state`` (None if empty).

    Raises:
        ServiceError: INVALID_PROGRAM, the bytes are not a state of this torch's generator.
    """
    if not raw:
        return None
    size = torch.get_rng_state().numel()
    if len(raw) != size:
        raise ServiceError(
            Reason.INVALID_PROGRAM,
            f"rng_state has {len(raw)} bytes; this server's generator state has {size}",
            field="rng_state",
        )
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@contextlib.contextmanager
def running_with(state: torch.Tensor | None) -> Iterator[list[bytes]]:
    """Run the body with the default CPU generator set to ``state`` (when given); yields a
    list that holds, after the body, the state it left if that differs from ``state``. The
    server's own state is restored in every case."""
    after: list[bytes] = []
    if state is None:
        yield after
        return
    own = torch.get_rng_state()
    try:
        torch.set_rng_state(state)
    except RuntimeError as e:
        raise ServiceError(
            Reason.INVALID_PROGRAM, f"rng_state is not a generator state: {e}",
            field="rng_state",
        ) from e
    try:
        yield after
        now = torch.get_rng_state()
        if not torch.equal(now, state):
            after.append(now.numpy().tobytes())
    finally:
        torch.set_rng_state(own)


__all__ = ["parse", "running_with"]
