"""The client: ``RemotePartitioner``, a real ExecuTorch ``Partitioner`` backed by the service."""

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
    RemotePartitionerError,
)
from remote_partitioner.client.remote import RemotePartitioner

__all__ = [
    "FingerprintMismatchError",
    "IncompatibleServerError",
    "InvalidSpecError",
    "PartitionerNotFoundError",
    "RemotePartitioner",
    "RemotePartitionerError",
    "channel_credentials",
    "read_channel_credentials",
    "read_token",
]
