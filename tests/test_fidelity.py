"""Fidelity: lowering through the server gives the local partitioner's `.pte`, byte for byte.

Every test here lowers the same program twice, once with the local partitioner and once with a
``RemotePartitioner`` for the same partitioner and spec against a real server process on a
loopback port, and compares the results: `.pte` bytes, ExecuTorch runtime outputs, tags.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import EdgeProgramManager, to_edge, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from executorch.exir.program._fake_program import get_fake_program
from models import Cond, Mlp16, Tied
from torch.export import Dim, ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.proto import codec

EXAMPLE_MODELS = [
    "linear", "add_mul", "softmax", "conv1d", "lstm", "ds_cnn", "deep_autoencoder",
    "mobilenet_v1_025", "resnet8", "sdpa",
]
#: The example models `make test-fast` lowers (a few seconds each); the rest are `slow`.
FAST_MODELS = ("linear", "add_mul")
slow = pytest.mark.slow


def by_speed(names: list[str], fast: tuple[str, ...] = FAST_MODELS) -> list[Any]:
    """``names`` as parameters, those not in ``fast`` marked slow."""
    return [pytest.param(n, marks=() if n in fast else slow) for n in names]


def example(name: str) -> tuple[ExportedProgram, tuple[Any, ...]]:
    from executorch.examples.models import MODEL_NAME_TO_MODEL
    from executorch.examples.models.model_factory import EagerModelFactory

    torch.manual_seed(0)
    model, inputs, _, dynamic_shapes = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL[name])
    ep = export(model.eval(), inputs, dynamic_shapes=dynamic_shapes, strict=True)
    return ep, inputs


def lower(programs: Any, partitioner: Partitioner | None) -> EdgeProgramManager:
    return to_edge_transform_and_lower(
        programs, partitioner=[partitioner] if partitioner is not None else None
    )


def run(pte: bytes, inputs: tuple[Any, ...], method: str = "forward") -> list[torch.Tensor]:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    flat = torch.utils._pytree.tree_leaves(inputs)
    return list(program.load_method(method).execute(flat))


def assert_same_lowering(
    programs: Any,
    local: Partitioner,
    remote: RemotePartitioner,
    inputs: dict[str, tuple[Any, ...]] | None = None,
) -> bytes:
    """Lower ``programs`` with both partitioners; assert equal bytes and runtime outputs, and
    that something was delegated."""
    local_pte = lower(copy.deepcopy(programs), local).to_executorch().buffer
    edge = lower(programs, remote)
    remote_pte = edge.to_executorch().buffer
    assert remote_pte == local_pte, (
        f"remote .pte ({len(remote_pte)} bytes) differs from local ({len(local_pte)} bytes)"
    )
    assert any(
        "executorch_call_delegate" in str(n.target)
        for m in edge.methods
        for n in edge.exported_program(m).graph.nodes
    ), "nothing was delegated: the comparison would prove little"
    for method, args in (inputs or {}).items():
        got = run(remote_pte, args, method)
        want = run(local_pte, args, method)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    return remote_pte


@pytest.fixture()
def xnnpack(server_address: str) -> RemotePartitioner:
    return RemotePartitioner(server_address, "xnnpack", timeout=600)


@pytest.mark.parametrize("name", by_speed(EXAMPLE_MODELS))
def test_example_model_byte_identical(name: str, xnnpack: RemotePartitioner) -> None:
    """The local ``.pte`` and runtime outputs, and outputs close to the eager model's."""
    ep, inputs = example(name)
    with torch.no_grad():
        eager = torch.utils._pytree.tree_leaves(ep.module()(*inputs))
    pte = assert_same_lowering(ep, XnnpackPartitioner(), xnnpack, {"forward": inputs})
    # The server answered (bytes_uploaded could be 0: the session's shared server may hold the
    # program already).
    assert xnnpack.stats["calls"] > 0
    got = run(pte, inputs)
    assert len(got) == len(eager)
    for g, e in zip(got, eager, strict=True):
        tolerance = 1e-3 if e.dtype == torch.float32 else 1e-2  # sdpa's half precision
        torch.testing.assert_close(g, e, rtol=tolerance, atol=tolerance)
    assert any(g.abs().sum() > 0 for g in got)


@slow
def test_pt2e_quantized_model(xnnpack: RemotePartitioner) -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10),
    ).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(export(model, inputs, strict=True).module(), quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    ep = export(converted, inputs, strict=True)
    assert any("quantize_per_tensor" in str(n.target) for n in ep.graph.nodes)
    assert_same_lowering(ep, XnnpackPartitioner(), xnnpack, {"forward": inputs})


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 16))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x * self.scale) + y


@pytest.mark.slow
def test_multi_method_dynamic_shapes(xnnpack: RemotePartitioner) -> None:
    batch = Dim("batch", min=1, max=32)
    torch.manual_seed(0)
    mlp, scale = Mlp16().eval(), _Scale().eval()
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    programs = {
        "forward": export(mlp, (x,), dynamic_shapes=({0: batch},), strict=True),
        "scale": export(scale, (x, y), dynamic_shapes=({0: batch}, {0: batch}), strict=True),
    }
    assert programs["forward"].range_constraints, "the program should have symbolic sizes"
    assert_same_lowering(
        programs, XnnpackPartitioner(), xnnpack,
        {"forward": (torch.randn(7, 16),), "scale": (torch.randn(3, 16), torch.randn(3, 16))},
    )


@slow
def test_control_flow_cond(xnnpack: RemotePartitioner) -> None:
    torch.manual_seed(0)
    model = Cond().eval()
    x = torch.randn(2, 4)
    ep = export(model, (x,), strict=True)
    assert any(n.target is torch.ops.higher_order.cond for n in ep.graph.nodes)
    assert_same_lowering(ep, XnnpackPartitioner(), xnnpack, {"forward": (x,)})
    pte = lower(export(model, (x,), strict=True), xnnpack).to_executorch().buffer
    for sample in (x.abs(), -x.abs()):  # both branches
        (got,) = run(pte, (sample,))
        torch.testing.assert_close(got, model(sample), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tied_weights(xnnpack: RemotePartitioner) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 5))
    ep = export(Tied().eval(), (tokens,), strict=True)
    assert_same_lowering(ep, XnnpackPartitioner(), xnnpack, {"forward": (tokens,)})


def test_tied_weights_share_storage_after_codec() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 5))
    ep = to_edge(export(Tied().eval(), (tokens,), strict=True)).exported_program()
    # Make two state_dict entries that share one storage, as tied weights are when both names
    # survive, and check that the codec sends the storage once and rebuilds one storage.
    (name, weight), = list(ep.state_dict.items())[:1]
    encoded = codec.encode_program(ep)
    decoded = codec.decode_program(encoded.message, lambda d: encoded.blobs[d.hash])
    assert torch.equal(decoded.state_dict[name], weight)
    view = weight.detach()[1:]
    enc2 = codec.encode_program(_with_constant(ep, "tied_view", view))
    storages = {r.storage.hash for r in enc2.message.constants} | {
        r.storage.hash for r in enc2.message.state_dict
    }
    assert len(storages) == 1, "a view of a parameter must name the parameter's storage blob"
    dec2 = codec.decode_program(enc2.message, lambda d: enc2.blobs[d.hash])
    a, b = dec2.state_dict[name], dec2.constants["tied_view"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert torch.equal(b, view)


def _with_constant(ep: ExportedProgram, name: str, t: torch.Tensor) -> ExportedProgram:
    ep = copy.copy(ep)
    ep._constants = {**ep.constants, name: t}
    return ep


@pytest.mark.slow
def test_to_backend_path(xnnpack: RemotePartitioner) -> None:
    ep, inputs = example("ds_cnn")
    local = to_edge(copy.deepcopy(ep)).to_backend(XnnpackPartitioner()).to_executorch().buffer
    remote = to_edge(ep).to_backend(xnnpack).to_executorch().buffer
    assert remote == local
    (got,) = run(remote, inputs)
    (want,) = run(local, inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ------------------------------------------------------------------ hooks, one by one


@pytest.mark.parametrize("name", by_speed(["mobilenet_v1_025", "lstm", "sdpa"], ()))
def test_filter_answers_equal_on_every_node(name: str, xnnpack: RemotePartitioner) -> None:
    """On every program ``to_edge_transform_and_lower`` asks about, the remote filter answers
    what XNNPACK's own filter answers, node by node."""
    ep, _ = example(name)
    compared: list[int] = []

    class Comparing(XnnpackPartitioner):
        def ops_to_not_decompose(self, program: ExportedProgram) -> Any:
            local_ops, local_filter = super().ops_to_not_decompose(program)
            remote_ops, remote_filter = xnnpack.ops_to_not_decompose(program)
            assert remote_ops == local_ops
            assert (remote_filter is None) == (local_filter is None)
            if local_filter is not None and remote_filter is not None:
                nodes = [
                    n for _, gm in codec.graph_modules(program.graph_module) for n in gm.graph.nodes
                ]
                assert [_answer(remote_filter, n) for n in nodes] == [
                    _answer(local_filter, n) for n in nodes
                ]
                compared.append(len(nodes))
            return local_ops, local_filter

    lower(ep, Comparing()).to_executorch()
    assert len(compared) == 5, "to_edge_transform_and_lower asks five times per method"


def _answer(check: Callable[[torch.fx.Node], bool], node: torch.fx.Node) -> object:
    try:
        return bool(check(node))
    except Exception as e:
        return (type(e), str(e))


def _tags(ep: ExportedProgram) -> dict[tuple[str, str], str]:
    return {
        (path, n.name): n.meta["delegation_tag"]
        for path, gm in codec.graph_modules(ep.graph_module)
        for n in gm.graph.nodes
        if "delegation_tag" in n.meta
    }


def _partition_both(
    edge: ExportedProgram, local: Partitioner, remote: RemotePartitioner
) -> tuple[Any, Any]:
    want = local.partition(get_fake_program(edge))
    got = remote.partition(get_fake_program(edge))
    return want, got


PARTITIONERS = {
    "coreml": "executorch.backends.apple.coreml.partition:CoreMLPartitioner",
    "vulkan": "executorch.backends.vulkan.partitioner.vulkan_partitioner:VulkanPartitioner",
    "xnnpack": "executorch.backends.xnnpack.partition.xnnpack_partitioner:XnnpackPartitioner",
}
#: (model, partitioner) pairs `make test-fast` checks: one model per backend that is quick.
FAST_PAIRS = {("ds_cnn", "coreml"), ("ds_cnn", "xnnpack")}


@pytest.mark.parametrize(
    ("partitioner", "factory", "name"),
    [
        pytest.param(p, f, n, marks=() if (n, p) in FAST_PAIRS else slow)
        for n in ("mobilenet_v1_025", "ds_cnn", "sdpa") for p, f in PARTITIONERS.items()
    ],
)
def test_equal_tags_and_delegation_specs(
    partitioner: str, factory: str, name: str, server_address: str
) -> None:
    import importlib

    module, cls = factory.split(":")
    local_partitioner = getattr(importlib.import_module(module), cls)()
    remote = RemotePartitioner(server_address, partitioner, timeout=600)
    ep, _ = example(name)
    edge = to_edge(ep).exported_program()
    want, got = _partition_both(edge, local_partitioner, remote)
    assert _tags(got.tagged_exported_program) == _tags(want.tagged_exported_program)
    assert _tags(want.tagged_exported_program), f"{partitioner} tagged nothing in {name}"
    assert list(got.partition_tags) == list(want.partition_tags)
    for tag, spec in want.partition_tags.items():
        assert got.partition_tags[tag].backend_id == spec.backend_id
        assert [(c.key, c.value) for c in got.partition_tags[tag].compile_specs] == [
            (c.key, c.value) for c in spec.compile_specs
        ]
    # The other node.meta entries the partitioner sets reach the caller's nodes too.
    assert _other_meta(got.tagged_exported_program) == _other_meta(want.tagged_exported_program)
    if partitioner == "xnnpack":
        assert any(_other_meta(want.tagged_exported_program).values())


#: node.meta entries other than the tag that XNNPACK's partitioner sets.
OTHER_META = ("xnn_partitioner_config", "IS_IMPLICIT_Q_DQ_TAG")


def _other_meta(program: ExportedProgram) -> dict[str, dict[str, Any]]:
    return {
        n.name: {k: n.meta[k] for k in OTHER_META if k in n.meta} for n in program.graph.nodes
    }


@slow
def test_vulkan_spec_keys_reach_the_partitioner(server_address: str) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    ep, _ = example("mobilenet_v1_025")
    edge = to_edge(ep).exported_program()
    options = {"force_fp16": True, "require_dynamic_shapes": False}
    remote = RemotePartitioner(server_address, "vulkan", options, timeout=600)
    want, got = _partition_both(edge, VulkanPartitioner(compile_options=dict(options)), remote)
    specs = {t: [(c.key, c.value) for c in s.compile_specs] for t, s in want.partition_tags.items()}
    assert specs == {
        t: [(c.key, c.value) for c in s.compile_specs] for t, s in got.partition_tags.items()
    }
    assert _tags(got.tagged_exported_program) == _tags(want.tagged_exported_program)


def test_partition_returns_the_callers_program(xnnpack: RemotePartitioner) -> None:
    ep, _ = example("linear")
    fake = get_fake_program(to_edge(ep).exported_program())
    result = xnnpack.partition(fake)
    assert result.tagged_exported_program is fake


@slow
def test_second_lowering_sends_no_tensor_again(server_address: str) -> None:
    torch.manual_seed(20261130)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    )
    ep = export(model.eval(), (torch.randn(2, 256),), strict=True)
    tensor_bytes = sum(t.numel() * t.element_size() for t in ep.state_dict.values())
    # With the data sent (withhold_tensors=False: the path a hook that reads values takes).
    first = RemotePartitioner(server_address, "xnnpack", timeout=600, withhold_tensors=False)
    lower(copy.deepcopy(ep), first).to_executorch()
    sent = first.stats["tensor_bytes_uploaded"]
    assert first.stats["bytes_uploaded"] - first.stats["graph_bytes_uploaded"] == sent
    assert tensor_bytes <= sent <= 1.05 * tensor_bytes, "each tensor crosses once"
    second = RemotePartitioner(server_address, "xnnpack", timeout=600, withhold_tensors=False)
    lower(copy.deepcopy(ep), second).to_executorch()
    assert second.stats["bytes_uploaded"] == second.stats["graph_bytes_uploaded"]
    assert second.stats["tensor_bytes_uploaded"] == 0
    # By default the hooks get the program withheld: no tensor crosses at all.
    third = RemotePartitioner(server_address, "xnnpack", timeout=600)
    lower(ep, third).to_executorch()
    assert third.stats["tensor_bytes_uploaded"] == 0
    assert third.stats["withheld_calls"] >= 3 and third.stats["tensor_data_requests"] == 0


def test_unoverridden_hook_skips_the_round_trip(xnnpack: RemotePartitioner) -> None:
    ep, _ = example("linear")
    assert not xnnpack.overrides("transform_for_pre_decomposition")  # fetches the info once
    calls = xnnpack.stats["calls"]
    assert xnnpack.transform_for_pre_decomposition(ep) is ep
    assert xnnpack.stats["calls"] == calls


@slow
def test_remote_lowering_in_a_process_without_the_backend(server_address: str) -> None:
    """A process that never imported XNNPACK lowers through the server: the client imports the
    backend's preprocess module the server names."""
    import subprocess
    import sys

    script = f"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch.export import export
from executorch.exir import to_edge_transform_and_lower
from remote_partitioner.client import RemotePartitioner
assert "executorch.backends.xnnpack.xnnpack_preprocess" not in sys.modules
ep = export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),), strict=True)
remote = RemotePartitioner({server_address!r}, "xnnpack")
edge = to_edge_transform_and_lower(ep, partitioner=[remote])
print(len(edge.to_executorch().buffer))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip().splitlines()[-1]) > 0
