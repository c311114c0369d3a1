"""The client: ``RemotePartitioner``, a real ExecuTorch ``Partitioner`` backed by the service, and
``RemoteQuantizer``, a real torchao PT2E ``Quantizer`` backed by it."""

from typing import TYPE_CHECKING, Any

from remote_partitioner.client.credentials import (
    channel_credentials,
    read_channel_credentials,
    read_token,
)
from remote_partitioner.client.errors import (
    FingerprintMismatchError,
    IncompatibleServerError,
    InvalidSpecError,
    PartitionerNotFoundError,
    QuantizerNotFoundError,
    RemotePartitionerError,
)

if TYPE_CHECKING:
    from remote_partitioner.client.quantizer import RemoteQuantizer
    from remote_partitioner.client.remote import RemotePartitioner, to_backend_remotely


def __getattr__(name: str) -> Any:
    # RemotePartitioner needs torch and ExecuTorch; the command line's client commands and the
    # errors and credentials helpers do not, so it is imported on first use.
    if name == "RemotePartitioner":
        from remote_partitioner.client.remote import RemotePartitioner

        return RemotePartitioner
    if name == "RemoteQuantizer":
        from remote_partitioner.client.quantizer import RemoteQuantizer

        return RemoteQuantizer
    if name == "to_backend_remotely":
        from remote_partitioner.client.remote import to_backend_remotely

        return to_backend_remotely
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "FingerprintMismatchError",
    "IncompatibleServerError",
    "InvalidSpecError",
    "PartitionerNotFoundError",
    "QuantizerNotFoundError",
    "RemotePartitioner",
    "RemotePartitionerError",
    "RemoteQuantizer",
    "channel_credentials",
    "read_channel_credentials",
    "read_token",
    "to_backend_remotely",
]
