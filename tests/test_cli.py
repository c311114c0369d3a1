"""The console script's package, ``remote_partitioner.cli``: it joins ``serve`` and the client
commands, parses ``serve`` as the server's own entry point does, and starts light."""

from __future__ import annotations

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
