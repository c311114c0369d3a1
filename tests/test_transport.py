"""The shared transport and security facts (``remote_partitioner.proto.transport``): they match
the generated code, both sides use the one copy, and importing them stays light."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import modules_loaded_by

from remote_partitioner.proto import transport
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb


def test_service_name_is_the_descriptors() -> None:
    assert pb.DESCRIPTOR.services_by_name["RemotePartitioner"].full_name == transport.SERVICE_NAME


def test_hooks_match_the_wire_enum() -> None:
    # Every hook has a member, in enum order, and every member but UNSPECIFIED is a hook.
    values = [transport.hook_to_wire(h) for h in transport.HOOKS]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert {pb.Hook.Name(v) for v in values} == set(pb.Hook.keys()) - {"HOOK_UNSPECIFIED"}
    for hook in transport.HOOKS:
        assert transport.hook_from_wire(transport.hook_to_wire(hook)) == hook
    assert transport.hook_from_wire(pb.HOOK_UNSPECIFIED) is None
    assert transport.hook_from_wire(999) is None  # a newer server's hook
    with pytest.raises(KeyError):
        transport.hook_to_wire("to_backend")


def test_one_copy_on_both_sides() -> None:
    from remote_partitioner.client import channel, cli
    from remote_partitioner.server import probe, registry, settings

    assert channel.SERVICE_NAME is transport.SERVICE_NAME
    options = dict(channel.DEFAULT_CHANNEL_OPTIONS)
    assert options["grpc.max_receive_message_length"] == transport.MAX_MESSAGE_BYTES
    assert options["grpc.max_send_message_length"] == transport.MAX_MESSAGE_BYTES
    assert cli.DEFAULT_TARGET == settings.DEFAULT_ADDRESS == probe.DEFAULT_ADDRESS
    assert settings.DEFAULT_ADDRESS is transport.DEFAULT_ADDRESS
    assert registry.HOOKS is transport.HOOKS


def test_tokens_in_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n\n  alpha  \nbeta\nalpha\n")
    assert list(transport.tokens_in_file(path)) == ["alpha", "beta", "alpha"]
    # Lines are checked as they are reached: the first token is there before a bad line.
    path.write_text("first\nnot a token\n")
    tokens = transport.tokens_in_file(path)
    assert next(tokens) == "first"
    with pytest.raises(ValueError, match="line 2: a token must be visible ASCII") as e:
        next(tokens)
    assert "not a token" not in str(e.value)
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no token"):
        list(transport.tokens_in_file(path))
    with pytest.raises(ValueError, match="cannot read token file"):
        list(transport.tokens_in_file(tmp_path / "missing"))


def test_pem_checks(tmp_path: Path) -> None:
    assert transport.is_pem_certificate(b"x\n-----BEGIN CERTIFICATE-----\n")
    assert not transport.is_pem_certificate(b"-----BEGIN PRIVATE KEY-----")
    for kind in (b"", b"RSA ", b"EC ", b"ENCRYPTED "):
        assert transport.is_pem_private_key(b"-----BEGIN " + kind + b"PRIVATE KEY-----")
    assert not transport.is_pem_private_key(b"-----BEGIN CERTIFICATE-----")
    (tmp_path / "f").write_bytes(b"data")
    assert transport.read_file_bytes(tmp_path / "f", "thing") == b"data"
    with pytest.raises(ValueError, match=r"cannot read thing '.*missing'"):
        transport.read_file_bytes(tmp_path / "missing", "thing")


def test_importing_it_stays_light() -> None:
    """Neither grpc, protobuf, torch nor ExecuTorch is imported with it (the probe and the
    command line read it first; the registry must stay free of gRPC code)."""
    loaded = modules_loaded_by(
        "import remote_partitioner.proto.transport", {"grpc", "google", "torch", "executorch"},
        timeout=60,
    )
    assert loaded == []
