"""One address for several environments: a default server that lists its peer's entries
(``--peer``), a peer that is environment ``arm`` (``--environment``), and Debian's nginx in
front of both, running the project's own front-door configuration
(deploy/k8s/overlays/environments/nginx.conf), as that overlay deploys it.

The servers run in this process and host main-environment backends (the peer hosts Vulkan
under the name ``arm``): what is tested is the routing, which knows no backend. Lowering Arm's
own backends through the front door, with the peer in the Arm environment, is in test_arm.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from models import small_models
from servers import front_door, inproc_server
from test_node_client import NODE, NPM, run_cli
from test_node_client import node_client as node_cli  # noqa: F401 (a fixture, by this name)

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.errors import RemotePartitionerError
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.proto.transport import ENVIRONMENT_METADATA_KEY
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.backend_registry import default_backend_registry
from remote_partitioner.server.environments import Environment
from remote_partitioner.server.quantizers import default_quantizers
from remote_partitioner.server.registry import default_registry

TIMEOUT = 120.0


def _family(family: str, environment: Environment) -> dict[str, Any]:
    return {
        "registry": default_registry(plugins=False, only=[family]),
        "backends": default_backend_registry(plugins=False, only=[family]),
        "quantizers": default_quantizers(plugins=False, only=[family]),
        "environment": environment,
    }


@pytest.fixture(scope="module")
def environments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The peer (environment arm, hosting vulkan), the default server (xnnpack, peer arm) and
    the front door before them."""
    with inproc_server(**_family("vulkan", Environment("arm"))) as (peer, peer_target):
        default_env = Environment("", {"arm": peer_target})
        with inproc_server(**_family("xnnpack", default_env)) as (main, main_target), \
                front_door(tmp_path_factory.mktemp("nginx"),
                           {"default": main_target, "arm": peer_target}) as target:
            yield {"front": target, "main": (main, main_target), "peer": (peer, peer_target)}


def _listing(target: str, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    with grpc.insecure_channel(target) as channel:
        return pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
            pb.ListPartitionersRequest(), timeout=TIMEOUT, metadata=metadata)


def _lower(partitioner: Any, model: str = "mlp") -> bytes:
    module, inputs = small_models()[model]
    torch.manual_seed(0)
    ep = torch.export.export(module, inputs)
    return bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)


def test_the_front_door_lists_every_environment(environments: dict[str, Any]) -> None:
    listing = _listing(environments["front"])
    assert listing.environment == ""
    where = {p.name: p.environment for p in listing.partitioners}
    assert where == {"xnnpack": "", "vulkan": "arm"}
    assert [p.name for p in listing.partitioners] == sorted(where)
    assert {b.backend_id: b.environment for b in listing.backends} == {
        "XnnpackBackend": "", "VulkanBackend": "arm"}
    assert {q.name: q.environment for q in listing.quantizers} == {"xnnpack": "", "vulkan": "arm"}
    [arm] = listing.environments
    assert arm.name == "arm" and arm.error == "" and arm.accepts_withheld_tensors
    assert arm.accepts_withheld_lowered_programs
    assert arm.versions == listing.versions  # (both servers run in this process)
    # The peer itself lists its own entries only, under its own name; so does the front door
    # asked with the header (the listing is the one call routed either way).
    for peer_listing in (_listing(environments["peer"][1]),
                         _listing(environments["front"], ((ENVIRONMENT_METADATA_KEY, "arm"),))):
        assert peer_listing.environment == "arm" and not peer_listing.environments
        assert [p.name for p in peer_listing.partitioners] == ["vulkan"]


def test_lowering_through_the_front_door_reaches_each_environment(
    environments: dict[str, Any],
) -> None:
    front = environments["front"]
    peer, main = environments["peer"][0], environments["main"][0]
    peer_bytes = peer.servicer.instance.blobs.nbytes
    main_bytes = main.servicer.instance.blobs.nbytes
    vulkan = RemotePartitioner(front, "vulkan", timeout=TIMEOUT)
    assert _lower(vulkan) == _lower(VulkanPartitioner())
    assert peer.servicer.instance.blobs.nbytes > peer_bytes  # the program went to the peer
    assert main.servicer.instance.blobs.nbytes == main_bytes  # and nothing to the default
    xnnpack = RemotePartitioner(front, "xnnpack", timeout=TIMEOUT)
    assert _lower(xnnpack) == _lower(XnnpackPartitioner())
    assert main.servicer.instance.blobs.nbytes > main_bytes
    vulkan.close()
    xnnpack.close()


def test_a_whole_lowering_goes_to_its_environment(
    environments: dict[str, Any], tmp_path: Path
) -> None:
    module, inputs = small_models()["mlp"]
    archive = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, inputs), str(archive))
    data = archive.read_bytes()
    with LowerClient(environments["front"], timeout=TIMEOUT) as front, \
            LowerClient(environments["peer"][1], timeout=TIMEOUT) as direct:
        via_front = front.lower(data, [partitioner_ref("vulkan")])
        via_peer = direct.lower(data, [partitioner_ref("vulkan")])
        assert via_front.pte == via_peer.pte and via_front.pte
        with pytest.raises(RemotePartitionerError) as e:
            front.lower(data, [partitioner_ref("xnnpack"), partitioner_ref("vulkan")])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "xnnpack (default), vulkan (arm)" in str(e.value)


def test_a_call_for_another_environment_is_refused_and_the_server_keeps_serving(
    environments: dict[str, Any],
) -> None:
    main_target = environments["main"][1]
    # The client reads the default server's listing, which places vulkan in environment arm,
    # and sends its calls there with the header: that server is not arm's.
    vulkan = RemotePartitioner(main_target, "vulkan", timeout=TIMEOUT)
    with pytest.raises(RemotePartitionerError) as e:
        _lower(vulkan)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.reason == "WRONG_ENVIRONMENT"
    assert "this server is the default environment" in str(e.value)
    assert "front door" in str(e.value)
    xnnpack = RemotePartitioner(main_target, "xnnpack", timeout=TIMEOUT)
    assert _lower(xnnpack) == _lower(XnnpackPartitioner())
    # The peer refuses a call for an environment other than its own, too.
    with grpc.insecure_channel(environments["peer"][1]) as channel, \
            pytest.raises(grpc.RpcError) as raw:
        pb_grpc.RemotePartitionerStub(channel).FindMissingBlobs(
            pb.FindMissingBlobsRequest(), timeout=TIMEOUT,
            metadata=((ENVIRONMENT_METADATA_KEY, "openvino"),))
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "environment 'arm'" in (raw.value.details() or "")
    vulkan.close()
    xnnpack.close()


def test_the_front_door_refuses_an_unknown_environment(environments: dict[str, Any]) -> None:
    with grpc.insecure_channel(environments["front"]) as channel, \
            pytest.raises(grpc.RpcError) as e:
        pb_grpc.RemotePartitionerStub(channel).FindMissingBlobs(
            pb.FindMissingBlobsRequest(), timeout=TIMEOUT,
            metadata=((ENVIRONMENT_METADATA_KEY, "nowhere"),))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown x-remote-partitioner-environment" in (e.value.details() or "")


def test_an_environment_that_does_not_answer_is_listed_with_its_error() -> None:
    with inproc_server(**_family("xnnpack", Environment("", {"arm": "127.0.0.1:1"}))) as (
        _, target
    ):
        listing = _listing(target)
        assert [p.name for p in listing.partitioners] == ["xnnpack"]
        [arm] = listing.environments
        assert arm.name == "arm" and arm.error.startswith("UNAVAILABLE")
        missing = RemotePartitioner(target, "vulkan", timeout=TIMEOUT)
        with pytest.raises(RemotePartitionerError) as e:
            _ = missing.info
        assert "environment arm is not available: UNAVAILABLE" in str(e.value)
        missing.close()


def test_cli_list_shows_each_environment(environments: dict[str, Any]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "list", "--target",
         environments["front"]],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("server ") and lines[1].startswith("environment arm: server ")
    assert "vulkan  VulkanBackend  " in out.stdout
    assert any(line.startswith("vulkan  ") and line.endswith("[environment arm]")
               for line in lines)
    assert any(line.startswith("xnnpack  ") and "environment" not in line for line in lines)


@pytest.mark.parametrize("text", ["arm", "=x", "Arm=x", "arm=", "1arm=x"])
def test_peer_flags_are_checked(text: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.server.cli", "serve", "--peer", text],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert out.returncode == 2 and "--peer" not in out.stdout
    assert "environment name" in out.stderr or "NAME=TARGET" in out.stderr, out.stderr


@pytest.mark.skipif(NODE is None or NPM is None, reason="node and npm are not on PATH")
def test_the_node_client_routes_its_lowering(
    environments: dict[str, Any], node_cli: Path, tmp_path: Path,  # noqa: F811
) -> None:
    """The Node.js client's `lower` through the front door reaches the peer (the `.pte` the
    peer itself gives), and its `list` marks the peer's entries as the Python CLI does."""
    module, inputs = small_models()["mlp"]
    archive = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, inputs), str(archive))
    out = tmp_path / "node.pte"
    done = run_cli(node_cli, "lower", str(archive), "-o", str(out), "--partitioner", "vulkan",
                   "--target", environments["front"])
    assert done.returncode == 0, done.stdout + done.stderr
    with LowerClient(environments["peer"][1], timeout=TIMEOUT) as direct:
        assert out.read_bytes() == direct.lower(archive.read_bytes(),
                                                [partitioner_ref("vulkan")]).pte
    listed = run_cli(node_cli, "list", "--target", environments["front"])
    assert listed.returncode == 0, listed.stderr
    python = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "list", "--target",
         environments["front"]],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert listed.stdout == python.stdout
    assert "[environment arm]" in listed.stdout
