"""The versions that decide whether a server reproduces a local lowering.

``ListPartitioners`` reports them (``ServerVersions``: torch, ExecuTorch, the export schema,
the API, this package, torchao, and Python's string hash seed,
:mod:`remote_partitioner.server.hash_seed`), and the result cache keys on them together with
a digest of the whole environment (:func:`~remote_partitioner.server.results.environment_key`).
"""

from __future__ import annotations

from importlib import metadata

import torch

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.server.hash_seed import current_seed
from remote_partitioner.server.results import environment_key


def server_versions() -> pb.ServerVersions:
    """The versions that decide whether this server reproduces a local lowering."""
    from torch._export.serde.schema import SCHEMA_VERSION

    return pb.ServerVersions(
        torch=torch.__version__,
        executorch=metadata.version("executorch"),
        export_schema=".".join(map(str, SCHEMA_VERSION)),
        api="v1",
        server=metadata.version("remote-partitioner"),
        torchao=metadata.version("torchao"),
        python_hash_seed=current_seed(),
    )


def versions_key() -> str:
    """This server's versions and environment, as the result cache keys on them."""
    return server_versions().SerializeToString(deterministic=True).hex() + environment_key()


__all__ = ["server_versions", "versions_key"]
