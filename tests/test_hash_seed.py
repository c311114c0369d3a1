"""A server runs with a fixed string hash seed (``remote_partitioner.server.hash_seed``): Arm's
partitioner orders its partitions by it, so replicas, restarts and a local lowering at the same
seed agree (tests/test_arm.py shows the bytes).

* :func:`restart_with_fixed_seed` replaces a process started without ``PYTHONHASHSEED`` by
  itself with seed 0 (same process id, same arguments) and leaves an operator's value alone;
* the session's server, started as a user starts it, reports the seed it runs with in its
  listing, and the listing says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc

from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

#: Prints its process id, restarts with a fixed seed if it may, then prints its process id,
#: its seed, its arguments and the iteration order of a set of two strings.
SCRIPT = """
import os, sys, json
print(json.dumps({"pid": os.getpid()}), flush=True)
from remote_partitioner.server.hash_seed import current_seed, restart_with_fixed_seed
restart_with_fixed_seed()
print(json.dumps({"pid": os.getpid(), "seed": current_seed(), "argv": sys.argv[1:],
                  "order": list({"tag0", "tag1"})}))
"""


def _run(*flags: str, seed: str | None) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    out = subprocess.run([sys.executable, *flags, "-c", SCRIPT, "an", "argument"],
                         capture_output=True, text=True, timeout=60, env=env, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_process_without_a_seed_restarts_itself_with_seed_0() -> None:
    runs = [_run(seed=None) for _ in range(2)]
    for lines in runs:
        # The script's start, again after the restart, then its end.
        assert [sorted(line) for line in lines] == [["pid"], ["pid"], ["argv", "order", "pid",
                                                                        "seed"]]
        assert lines[0]["pid"] == lines[2]["pid"]  # exec: the same process, for its supervisor
        assert lines[2]["seed"] == "0"
        assert lines[2]["argv"] == ["an", "argument"]
    assert runs[0][2]["order"] == runs[1][2]["order"] == _run(seed="0")[1]["order"]


def test_an_operators_seed_is_kept() -> None:
    _, random = _run(seed="random")
    assert random["seed"] == "random"
    _, seven = _run(seed="7")
    assert seven["seed"] == "7"
    # An interpreter that ignores the environment (-E) cannot be given a seed: no loop.
    _, ignoring = _run("-E", seed=None)
    assert ignoring["seed"] == "random"


def test_the_server_reports_the_seed_it_runs_with(server_address: str) -> None:
    """The session's server was started as a user starts it (``remote-partitioner serve``),
    with this process's environment."""
    want = os.environ.get("PYTHONHASHSEED") or "0"
    with grpc.insecure_channel(server_address) as channel:
        listed = pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
            pb.ListPartitionersRequest(), timeout=60)
    assert listed.versions.python_hash_seed == (want if want.isdigit() else "random")
    text = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "list", "--target", server_address],
        capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"python hash seed {listed.versions.python_hash_seed}" in text.splitlines()[0]
