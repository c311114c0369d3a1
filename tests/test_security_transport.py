"""Transport security against real servers on 127.0.0.1: bearer tokens, TLS, mutual TLS.

Each server is built with ``create_server`` and the pieces of ``server/auth.py``; clients are
real ``RemotePartitioner``s (``.info`` calls ListPartitioners) and raw stubs. Every call has a
deadline, so a broken handshake fails the test instead of hanging it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from certs import Certs, make_certs
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.client import RemotePartitioner, RemotePartitionerError
from remote_partitioner.client.credentials import (
    channel_credentials,
    read_channel_credentials,
    read_token,
)
from remote_partitioner.proto.errors import DOMAIN
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.auth import (
    OPEN_METHODS,
    BearerTokenInterceptor,
    is_loopback,
    load_tokens,
    read_server_credentials,
    server_credentials,
)
from remote_partitioner.server.registry import Registry, default_registry

TOKEN = "s3cret-token_ABC.123"
OTHER_TOKEN = "another~token"
TIMEOUT = 10.0
NOPE = "/remote_partitioner.v1.RemotePartitioner/Nope"
# A handshake that must fail fails at once (UNAVAILABLE); the deadline only bounds a hang, and
# is long enough that a loaded machine's retries of the refused connection never reach it
# (which would turn the expected UNAVAILABLE into DEADLINE_EXCEEDED).
FAIL_TIMEOUT = 30.0


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def certs() -> Certs:
    return make_certs()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry(plugins=False)


def _serve(
    registry: Registry,
    *,
    tokens: tuple[str, ...] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> Iterator[int]:
    interceptors = [BearerTokenInterceptor(tokens)] if tokens else []
    with inproc_server(
        registry=registry, io_threads=4, interceptors=interceptors, credentials=credentials,
    ) as (_, target):
        yield int(target.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def token_port(registry: Registry) -> Iterator[int]:
    """Plaintext, token required."""
    yield from _serve(registry, tokens=(TOKEN, OTHER_TOKEN))


@pytest.fixture(scope="module")
def tls_port(registry: Registry, certs: Certs) -> Iterator[int]:
    """TLS (server certificate only), no token."""
    yield from _serve(
        registry, credentials=server_credentials(certs.server_cert, certs.server_key, None)
    )


@pytest.fixture(scope="module")
def mtls_port(registry: Registry, certs: Certs, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[int]:
    """Mutual TLS (client certificates signed by ``certs.ca``) and a token, from files."""
    d = tmp_path_factory.mktemp("mtls")
    (d / "server.pem").write_bytes(certs.server_cert)
    (d / "server.key").write_bytes(certs.server_key)
    (d / "ca.pem").write_bytes(certs.ca)
    (d / "tokens").write_text(f"# accepted\n\n  {TOKEN}  \n")
    creds = read_server_credentials(d / "server.pem", d / "server.key", d / "ca.pem")
    yield from _serve(registry, tokens=tuple(load_tokens(d / "tokens")), credentials=creds)


def _reason(e: grpc.RpcError) -> str:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == DOMAIN
            return info.reason
    raise AssertionError("no ErrorInfo in the status")


def _list(channel: grpc.Channel, token: str | None = None) -> pb.ListPartitionersResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    return pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
        pb.ListPartitionersRequest(), timeout=TIMEOUT, metadata=metadata
    )


# ------------------------------------------------------------------------------ tokens


def test_missing_token_is_unauthenticated(token_port: int) -> None:
    remote = RemotePartitioner(f"127.0.0.1:{token_port}", "xnnpack", timeout=TIMEOUT)
    with pytest.raises(RemotePartitionerError) as info:
        _ = remote.info
    remote.close()
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.reason == "UNAUTHENTICATED"
    assert TOKEN not in str(info.value)


def test_wrong_token_is_permission_denied(
    token_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    remote = RemotePartitioner(
        f"127.0.0.1:{token_port}", "xnnpack", timeout=TIMEOUT, token="not-" + TOKEN
    )
    with pytest.raises(RemotePartitionerError) as info:
        _ = remote.info
    remote.close()
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.reason == "PERMISSION_DENIED"
    assert "rejected" in caplog.text, "the rejection is logged"
    assert TOKEN not in caplog.text and TOKEN not in str(info.value), "the token leaked"


@pytest.mark.parametrize("token", [TOKEN, OTHER_TOKEN])
def test_right_token_works(token_port: int, token: str) -> None:
    remote = RemotePartitioner(f"127.0.0.1:{token_port}", "xnnpack", timeout=TIMEOUT,
                               token=token)
    assert remote.info.name == "xnnpack"
    remote.close()


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (f"Basic {TOKEN}", grpc.StatusCode.UNAUTHENTICATED),
        (TOKEN, grpc.StatusCode.UNAUTHENTICATED),
        ("Bearer", grpc.StatusCode.UNAUTHENTICATED),
        ("Bearer ", grpc.StatusCode.UNAUTHENTICATED),
        (f"Bearer {TOKEN} extra", grpc.StatusCode.UNAUTHENTICATED),
        (f"bearer {TOKEN}", None),  # the scheme is case-insensitive (RFC 6750)
        (f"Bearer {TOKEN[:-1]}", grpc.StatusCode.PERMISSION_DENIED),
        (f"Bearer {TOKEN}x", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_authorization_forms(token_port: int, value: str, code: grpc.StatusCode | None
                             ) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{token_port}") as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        call = stub.ListPartitioners.with_call
        if code is None:
            call(pb.ListPartitionersRequest(), timeout=TIMEOUT,
                 metadata=(("authorization", value),))
            return
        with pytest.raises(grpc.RpcError) as info:
            call(pb.ListPartitionersRequest(), timeout=TIMEOUT,
                 metadata=(("authorization", value),))
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert _reason(info.value) == code.name


def test_every_method_kind_is_guarded(token_port: int) -> None:
    """Unary-unary, stream-unary and unary-stream methods are all refused without a token,
    and a method the server does not have is refused too (nothing is revealed)."""
    with grpc.insecure_channel(f"127.0.0.1:{token_port}") as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        attempts = [
            lambda: stub.FindMissingBlobs(pb.FindMissingBlobsRequest(), timeout=TIMEOUT),
            lambda: stub.UploadBlobs(iter([pb.UploadBlobsRequest()]), timeout=TIMEOUT),
            lambda: list(stub.ReadBlobs(pb.ReadBlobsRequest(), timeout=TIMEOUT)),
            lambda: channel.unary_unary(NOPE, None, None)(
                b"", timeout=TIMEOUT),
        ]
        for attempt in attempts:
            with pytest.raises(grpc.RpcError) as info:
                attempt()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            assert _reason(info.value) == "UNAUTHENTICATED"
        # With the token, an unknown method is merely unimplemented.
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(NOPE, None, None)(
                b"", timeout=TIMEOUT, metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]


def test_health_is_open_without_token(token_port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{token_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "remote_partitioner.v1.RemotePartitioner"):
            r = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_open_methods() -> None:
    expected = {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
    assert expected == OPEN_METHODS


def test_interceptor_refuses_unusable_tokens() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BearerTokenInterceptor([])
    for bad in ("", "has space", "tab\there", "caf\u00e9"):
        with pytest.raises(ValueError, match="visible ASCII"):
            BearerTokenInterceptor([bad])


def test_load_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n\n  alpha \n\tbeta\n#gamma\nalpha\n")
    assert load_tokens(path) == frozenset({"alpha", "beta"})
    path.write_text("# only a comment\n\n   \n")
    with pytest.raises(ValueError, match="holds no token"):
        load_tokens(path)
    path.write_text("good\nnot good\n")
    with pytest.raises(ValueError, match="line 2") as info:
        load_tokens(path)
    assert "not good" not in str(info.value)
    with pytest.raises(ValueError, match="cannot read token file"):
        load_tokens(tmp_path / "missing")
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(ValueError, match="cannot read token file"):
        load_tokens(path)


def test_read_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("\n# my token\n   tok-1  \ntok-2\n")
    assert read_token(path) == "tok-1"
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no token"):
        read_token(path)
    path.write_text("two words\n")
    with pytest.raises(ValueError, match="visible ASCII"):
        read_token(path)
    with pytest.raises(ValueError, match="cannot read token file"):
        read_token(tmp_path / "missing")


# ------------------------------------------------------------------------------ TLS


def test_tls_client_trusting_the_ca_works(tls_port: int, certs: Certs) -> None:
    remote = RemotePartitioner(
        f"localhost:{tls_port}", "xnnpack", timeout=TIMEOUT,
        credentials=channel_credentials(certs.ca),
    )
    assert remote.info.name == "xnnpack"
    remote.close()


def test_tls_by_ip_address_matches_the_ip_san(tls_port: int, certs: Certs) -> None:
    with grpc.secure_channel(f"127.0.0.1:{tls_port}", channel_credentials(certs.ca)) as ch:
        assert _list(ch).partitioners


@pytest.mark.parametrize("trusted", ["system roots", "untrusted CA"])
def test_tls_client_without_the_ca_fails(tls_port: int, certs: Certs, trusted: str) -> None:
    roots = None if trusted == "system roots" else certs.untrusted_ca
    remote = RemotePartitioner(
        f"localhost:{tls_port}", "xnnpack", timeout=FAIL_TIMEOUT,
        credentials=channel_credentials(roots),
    )
    with pytest.raises(RemotePartitionerError) as info:
        _ = remote.info
    remote.close()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_to_tls_server_fails(tls_port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{tls_port}") as channel, \
            pytest.raises(grpc.RpcError) as info:
        pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
            pb.ListPartitionersRequest(), timeout=FAIL_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_mtls_without_client_cert_fails(mtls_port: int, certs: Certs) -> None:
    with grpc.secure_channel(f"localhost:{mtls_port}", channel_credentials(certs.ca)) as ch, \
            pytest.raises(grpc.RpcError) as info:
        pb_grpc.RemotePartitionerStub(ch).ListPartitioners(
            pb.ListPartitionersRequest(), timeout=FAIL_TIMEOUT,
            metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_mtls_with_untrusted_client_cert_fails(mtls_port: int, certs: Certs) -> None:
    remote = RemotePartitioner(
        f"localhost:{mtls_port}", "xnnpack", timeout=FAIL_TIMEOUT, token=TOKEN,
        credentials=channel_credentials(
            certs.ca, certs.untrusted_client_key, certs.untrusted_client_cert),
    )
    with pytest.raises(RemotePartitionerError) as info:
        _ = remote.info
    remote.close()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_mtls_and_token(mtls_port: int, certs: Certs, tmp_path: Path) -> None:
    """The good client certificate gets through TLS; the token is still required."""
    (tmp_path / "ca.pem").write_bytes(certs.ca)
    (tmp_path / "client.key").write_bytes(certs.client_key)
    (tmp_path / "client.pem").write_bytes(certs.client_cert)
    (tmp_path / "token").write_text(f"# for the test server\n{TOKEN}\n")
    creds = read_channel_credentials(
        tmp_path / "ca.pem", tmp_path / "client.key", tmp_path / "client.pem")
    target = f"localhost:{mtls_port}"

    without = RemotePartitioner(target, "xnnpack", timeout=TIMEOUT, credentials=creds)
    with pytest.raises(RemotePartitionerError) as info:
        _ = without.info
    without.close()
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED

    wrong = RemotePartitioner(target, "xnnpack", timeout=TIMEOUT, credentials=creds,
                              token=OTHER_TOKEN)  # accepted by another server, not this one
    with pytest.raises(RemotePartitionerError) as info:
        _ = wrong.info
    wrong.close()
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED

    remote = RemotePartitioner(target, "xnnpack", timeout=TIMEOUT, credentials=creds,
                               token=read_token(tmp_path / "token"))
    assert remote.info.name == "xnnpack"
    remote.close()

    with grpc.secure_channel(target, creds) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
        assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_partition_over_mtls_and_token(mtls_port: int, certs: Certs) -> None:
    """A real hook call over the whole stack tags like the local partitioner."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge
    from executorch.exir.program._fake_program import get_fake_program

    torch.manual_seed(0)
    edge = to_edge(
        torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    ).exported_program()

    def tags(ep: torch.export.ExportedProgram) -> dict[str, str]:
        return {n.name: n.meta["delegation_tag"]
                for n in ep.graph.nodes if "delegation_tag" in n.meta}

    want = XnnpackPartitioner().partition(get_fake_program(edge))
    remote = RemotePartitioner(
        f"localhost:{mtls_port}", "xnnpack", timeout=60.0, token=TOKEN,
        credentials=channel_credentials(certs.ca, certs.client_key, certs.client_cert),
    )
    got = remote.partition(get_fake_program(edge))
    remote.close()
    assert tags(got.tagged_exported_program) == tags(want.tagged_exported_program)
    assert tags(want.tagged_exported_program), "nothing was tagged: the test would prove little"
    assert set(got.partition_tags) == set(want.partition_tags)


def test_credentials_validation(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both"):
        channel_credentials(certs.ca, private_key=certs.client_key)
    with pytest.raises(ValueError, match="both"):
        channel_credentials(certs.ca, certificate_chain=certs.client_cert)
    with pytest.raises(ValueError, match="both"):
        read_channel_credentials(None, key_path=tmp_path / "k")
    with pytest.raises(ValueError, match="not a PEM"):
        channel_credentials(certs.ca, certs.client_cert, certs.client_key)  # swapped
    with pytest.raises(ValueError, match="cannot read"):
        read_channel_credentials(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="private key"):
        server_credentials(certs.server_cert, certs.server_cert, None)
    with pytest.raises(ValueError, match="certificate"):
        server_credentials(certs.server_key, certs.server_key, None)
    with pytest.raises(ValueError, match="cannot read"):
        read_server_credentials(tmp_path / "missing.pem", tmp_path / "missing.key")


# ------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.1.2.3:8080", True),
        ("localhost:0", True),
        ("LOCALHOST:50051", True),
        ("[::1]:50051", True),
        ("[::ffff:127.0.0.1]:50051", True),
        ("localhost", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.5:50051", False),
        ("192.168.1.1:50051", False),
        ("[2001:db8::1]:50051", False),
        ("example.com:50051", False),
        ("localhost.example.com:50051", False),
        ("unix:/tmp/socket", False),
        ("", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
