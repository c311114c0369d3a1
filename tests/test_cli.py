"""The console script's package, ``remote_partitioner.cli``: it joins ``serve`` and the client
commands, parses ``serve`` as the server's own entry point does, and starts light."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import modules_loaded_by

from remote_partitioner import cli
from remote_partitioner.client import cli as client_cli
from remote_partitioner.server import cli as server_cli


def test_every_command_is_there(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("serve", *client_cli.COMMANDS):
        assert command in out


def test_serve_parses_as_the_workers_entry_point_does() -> None:
    """Worker processes run ``python -m remote_partitioner.server.cli serve ...``: the same
    flags must mean the same there."""
    flags = ["serve", "--address", "127.0.0.1:0", "--workers", "3", "--max-nodes", "7",
             "--no-plugins", "--metrics-port", "0"]
    full, _ = cli.build_parser()
    serve_only, _ = server_cli.build_parser()
    assert vars(full.parse_args(flags)) == vars(serve_only.parse_args(flags))
    assert vars(full.parse_args(["serve"])) == vars(serve_only.parse_args(["serve"]))


def test_a_client_command_parses() -> None:
    parser, _ = cli.build_parser()
    args = parser.parse_args(["list", "--json"])
    assert args.command == "list" and args.json and args.target == client_cli.DEFAULT_TARGET


def test_unsafe_serve_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--address", "0.0.0.0:0", "--workers", "2"])
    assert e.value.code == 2 and "not a loopback address" in capsys.readouterr().err


def test_starting_it_imports_neither_torch_nor_executorch() -> None:
    loaded = modules_loaded_by(
        "import remote_partitioner.cli as c\nc.build_parser()", {"torch", "executorch"}
    )
    assert loaded == []


def test_python_dash_m_runs_it() -> None:
    done = subprocess.run([sys.executable, "-m", "remote_partitioner.cli", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "partition" in done.stdout


def test_version_names_the_package_torch_and_executorch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for dist in ("remote-partitioner", "torch", "executorch"):
        assert f"{dist} {importlib.metadata.version(dist)}" in out


@pytest.mark.parametrize("command", ["list", "partition", "lower"])
def test_help_shows_defaults(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"(default: {client_cli.DEFAULT_TARGET})" in out
    assert "(default: None)" not in out and "(default: False)" not in out
    if command != "list":
        assert "--skip-ir-validity-check do not verify the edge program's IR" in out


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("FALSE", False), ("42", 42), ("-7", -7), ("+3", 3),
    ("9223372036854775807", 2**63 - 1), ("1.5", 1.5), ("2.", 2.0), (".25", 0.25),
    ("1e-3", 0.001), ("-inf", -math.inf), ("str:8", "8"), ("str:true", "true"), ("str:", ""),
    ("1_000", "1_000"), (" 5", " 5"), ("1.2.3", "1.2.3"), ("", ""), ("CPU_ONLY", "CPU_ONLY"),
])
def test_spec_values_are_typed_as_in_node(text: str, value: object) -> None:
    """The same table as client/node/test/unit.test.js's parseSpecValue test."""
    parsed = client_cli.parse_spec_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_spec_nan_and_refusals() -> None:
    assert math.isnan(client_cli.parse_spec_value("NaN"))  # type: ignore[arg-type]
    with pytest.raises(client_cli.UsageError, match="int64"):
        client_cli.parse_spec_value("9223372036854775808")
    plan = [("partitioner", "a"), ("spec", "x=1"), ("partitioner", "b"), ("spec", "y=str:2")]
    assert client_cli.partitioner_plan(plan) == [("a", {"x": 1}), ("b", {"y": "2"})]
    for bad, words in (
        ([("spec", "x=1"), ("partitioner", "a")], "before any --partitioner"),
        ([], "--partitioner NAME is required"),
        ([("partitioner", "a"), ("spec", "x")], "KEY=VALUE"),
        ([("partitioner", "a"), ("spec", "x=1"), ("spec", "x=2")], "given twice"),
    ):
        with pytest.raises(client_cli.UsageError, match=words):
            client_cli.partitioner_plan(bad)


def test_a_usage_error_with_json_is_json_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["lower", "model.pt2", "--json", "--no-such-option"])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)["error"]
    assert (error["exit_code"], error["kind"]) == (2, "usage")
    assert "--no-such-option" in error["message"]


def test_failures_are_named_by_who_failed() -> None:
    """A rebuilt exception of the hosted partitioner is the partitioner's; any other exception
    is this client's own (a disk full while writing the .pte is not the partitioner's)."""
    import argparse

    import grpc

    from remote_partitioner.client.errors import RemotePartitionerError, remote_exception

    args = argparse.Namespace(target="127.0.0.1:9", timeout="0.5")
    raised = client_cli._failure(remote_exception("ValueError", "boom", "tb"), args)
    assert (raised.kind, str(raised)) == ("partitioner", "the partitioner raised ValueError: boom")
    bare = client_cli._failure(remote_exception("KeyError", "", "tb", True), args)
    assert str(bare) == "the partitioner raised KeyError"
    local = client_cli._failure(OSError(28, "No space left on device"), args)
    assert (local.kind, local.exit_code) == ("client", 1)
    assert "partitioner" not in str(local)
    down = client_cli._failure(RemotePartitionerError(
        "UNAVAILABLE: connection refused", grpc.StatusCode.UNAVAILABLE), args)
    assert (down.kind, down.exit_code, down.detail) == ("unreachable", 3, "connection refused")
    assert "remote-partitioner serve --address 127.0.0.1:9" in str(down)
    late = client_cli._failure(RemotePartitionerError(
        "DEADLINE_EXCEEDED: Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED), args)
    assert (late.kind, late.exit_code) == ("deadline", 1)
    assert "no answer within the --timeout of 0.5 s" in str(late)
