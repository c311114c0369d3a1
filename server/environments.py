"""Environments: one address for servers whose backends' toolchains conflict.

A backend whose toolchain pins packages against the rest (Arm's tosa-tools pins flatbuffers,
which changes every ``.pte``'s bytes) is hosted by a server in an environment of its own. A
front door, a gRPC proxy that routes by the request header
:data:`~remote_partitioner.proto.transport.ENVIRONMENT_METADATA_KEY` (Debian's nginx with
``grpc_pass``, ``deploy/k8s/overlays/environments/nginx.conf``; or a Gateway API
``GRPCRoute``), puts them behind one address. This module is the servers' side of it:

* :class:`Environment`: a server's own environment name (``serve --environment``; empty for
  the default one) and its peers (``serve --peer NAME=TARGET``), the other environments'
  servers as this server reaches them;
* :func:`merge_listings`: the default server's ``ListPartitioners`` answer lists what its peers
  host too, each entry naming its environment, with each peer's versions;
* :class:`EnvironmentInterceptor`: a call whose header names another environment than the
  server's ends with FAILED_PRECONDITION (reason ``WRONG_ENVIRONMENT``): it reached a server,
  not the front door, and answering it here would lower with the wrong toolchain or miss its
  blobs.

The client's side is one header per call (``ServerConnection``); routing itself is the
proxy's, not code of this project.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

import grpc

from remote_partitioner.proto.errors import Reason, ServiceError
from remote_partitioner.proto.transport import (
    ENVIRONMENT_METADATA_KEY,
    ENVIRONMENT_NAME,
    SERVICE_NAME,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.handlers import rejecting_handler
from remote_partitioner.server.status import make_status

logger = logging.getLogger(__name__)

#: Seconds a peer gets to answer ``ListPartitioners`` before it is listed with an error.
PEER_LISTING_TIMEOUT = 5.0

#: The method whose calls any environment's server answers, header or not: the listing.
LIST_METHOD = f"/{SERVICE_NAME}/ListPartitioners"


def check_name(name: str) -> str:
    """``name`` if it is a valid environment name (:data:`ENVIRONMENT_NAME`).

    Raises:
        ValueError: it is not.
    """
    if not ENVIRONMENT_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not an environment name: lowercase letters, digits and '-', "
            "starting with a letter, at most 31 characters"
        )
    return name


def parse_peer(text: str) -> tuple[str, str]:
    """``NAME=TARGET`` (``serve --peer``) as ``(name, target)``.

    Raises:
        ValueError: no ``=``, an invalid name, or an empty target.
    """
    name, sep, target = text.partition("=")
    if not sep or not target:
        raise ValueError(f"{text!r}: expected NAME=TARGET, e.g. arm=127.0.0.1:50052")
    return check_name(name), target


@dataclasses.dataclass(frozen=True)
class Environment:
    """A server's place among environments.

    Attributes:
        name: this server's environment (empty: the default one, which calls without the
            header reach).
        peers: the other environments' servers, name to gRPC target (plaintext), whose
            listings this server's ``ListPartitioners`` includes.
    """

    name: str = ""
    peers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name:
            check_name(self.name)
        for peer in self.peers:
            check_name(peer)
            if peer == self.name:
                raise ValueError(f"--peer {peer}: that is this server's own environment")


async def _peer_listing(
    name: str, target: str, metadata: tuple[tuple[str, str], ...]
) -> pb.ListPartitionersResponse | str:
    """The peer's listing, or why there is none."""
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.RemotePartitionerStub(channel)
            response: pb.ListPartitionersResponse = await stub.ListPartitioners(
                pb.ListPartitionersRequest(), timeout=PEER_LISTING_TIMEOUT, metadata=metadata
            )
    except grpc.aio.AioRpcError as e:
        logger.warning("environment %s at %s did not list: %s", name, target, e.code().name)
        return f"{e.code().name}: {e.details()}"
    if response.environment != name:
        return (f"the server at {target} is environment {response.environment or 'default'!r}"
                f", not {name!r} (check its --environment)")
    return response


async def merge_listings(
    own: pb.ListPartitionersResponse, environment: Environment,
    metadata: Iterable[tuple[str, str | bytes]] = (),
) -> pb.ListPartitionersResponse:
    """``own`` (this server's listing) with every peer's partitioners, backends and quantizers
    added under its environment's name, and an ``EnvironmentInfo`` per peer. The peers are
    asked at once; the caller's ``authorization`` header is passed on (the environments of one
    address accept the same tokens). A name listed by the default environment stays its own:
    a peer's entry of the same name is left out (and logged)."""
    own.environment = environment.name
    for p in own.partitioners:
        p.environment = environment.name
    for b in own.backends:
        b.environment = environment.name
    for q in own.quantizers:
        q.environment = environment.name
    if not environment.peers:
        return own
    passed = tuple((k, v) for k, v in metadata if k == "authorization" and isinstance(v, str))
    names = sorted(environment.peers)
    answers = await asyncio.gather(
        *(_peer_listing(n, environment.peers[n], passed) for n in names)
    )
    taken = {"partitioners": {p.name for p in own.partitioners},
             "backends": {b.backend_id for b in own.backends},
             "quantizers": {q.name for q in own.quantizers}}
    for name, answer in zip(names, answers, strict=True):
        info = own.environments.add(name=name)
        if isinstance(answer, str):
            info.error = answer
            continue
        info.versions.CopyFrom(answer.versions)
        info.accepts_withheld_tensors = answer.accepts_withheld_tensors
        info.accepts_withheld_lowered_programs = answer.accepts_withheld_lowered_programs
        for field, key in (("partitioners", "name"), ("backends", "backend_id"),
                           ("quantizers", "name")):
            for entry in getattr(answer, field):
                if getattr(entry, key) in taken[field]:
                    logger.warning("environment %s also lists %s %r: left out", name,
                                   field[:-1], getattr(entry, key))
                    continue
                taken[field].add(getattr(entry, key))
                entry.environment = name
                getattr(own, field).append(entry)
    own.partitioners.sort(key=lambda p: p.name)
    own.backends.sort(key=lambda b: b.backend_id)
    own.quantizers.sort(key=lambda q: q.name)
    return own


class EnvironmentInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call of the service whose :data:`ENVIRONMENT_METADATA_KEY` header names an
    environment other than ``name`` (FAILED_PRECONDITION, reason ``WRONG_ENVIRONMENT``; its
    request is never deserialized). Calls without the header, calls naming this environment,
    ``ListPartitioners`` and other services' calls (health, reflection) pass."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        handler = await continuation(handler_call_details)
        if method == LIST_METHOD or not method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        metadata = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        named = [v for k, v in metadata if k == ENVIRONMENT_METADATA_KEY]
        if not named or named == [self.name]:
            return handler
        here = f"environment {self.name!r}" if self.name else "the default environment"
        return rejecting_handler(handler, method, make_status(ServiceError(
            Reason.WRONG_ENVIRONMENT,
            f"this server is {here}, and the call is for environment "
            f"{', '.join(map(str, named))!r} ({ENVIRONMENT_METADATA_KEY}): connect to the "
            "address that serves every environment (the front door that routes by that "
            "header), not to one environment's server",
            {"environment": self.name, "requested": ",".join(map(str, named))},
        )))


__all__ = [
    "LIST_METHOD",
    "PEER_LISTING_TIMEOUT",
    "Environment",
    "EnvironmentInterceptor",
    "check_name",
    "merge_listings",
    "parse_peer",
]
