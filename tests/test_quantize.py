"""``RemoteQuantizer`` against the session's real server: ``prepare_pt2e`` with it, calibration
and ``convert_pt2e`` give the program the hosted backend's own quantizer gives locally (code,
node names, ``state_dict``, the random generator after), and lowering that program gives the
local ``.pte``; errors come back as statuses and the server keeps serving.

Every expected value is computed in the test, by the local quantizer and partitioner.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer

from remote_partitioner.client import RemotePartitioner, RemoteQuantizer
from remote_partitioner.client.errors import InvalidSpecError, QuantizerNotFoundError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

slow = pytest.mark.slow


class ConvBnLinear(torch.nn.Module):
    """Conv, batch norm and relu (XNNPACK's conv-bn annotators, which draw random inputs),
    a pool, a linear, an add and a mul by Python scalars (the transform's new constants), and
    a cat (shared specs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.lin = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        z = self.lin(y)
        return torch.cat([z * 2.0 + 1, z], 1)


def sequential() -> torch.nn.Module:
    """Numbered submodules (``features.0.weight``), as most real models have."""
    features = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
    )
    return torch.nn.Sequential(features, torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))


class InPlaceAndConstant(torch.nn.Module):
    """What export leaves in a module that the first lifting refused, though the local
    quantizer takes it: in-place operators (``squeeze_``, as ExecuTorch's LSTM tests have, and
    ``index_put_``), allowed by torch.export's training dialect, and a ``torch.tensor``
    constant in ``forward`` (``.module()``'s plain attribute ``lifted_tensor_0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.lin = torch.nn.Linear(4 * 6 * 6, 5)
        self.register_buffer("rows", torch.tensor([0, 1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(torch.relu(self.conv(x)).flatten(1)).unsqueeze(0)
        y.squeeze_(0)
        z = torch.zeros(3, 5)
        z.index_put_((self.rows,), y)
        return (y + z[:2]) * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])


def _local_quantizer(name: str, spec: dict[str, Any]) -> Quantizer:
    if name == "xnnpack":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(**spec))
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
    )
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        get_symmetric_quantization_config as vulkan_config,
    )

    return VulkanQuantizer().set_global(vulkan_config(**spec))


def _local_partitioner(name: str) -> Any:
    if name == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


def _quantize_and_lower(
    quantizer: Quantizer, partitioner: Any, model: Callable[[], torch.nn.Module] = ConvBnLinear,
) -> dict[str, Any]:
    """The suite's quantize stage (``export(strict=True).module()``, ``prepare_pt2e``, one
    calibration, ``convert_pt2e``), then export and lowering, from seed 0."""
    torch.manual_seed(0)
    m = model().eval()
    inputs = (torch.randn(2, 3, 8, 8),)
    gm = torch.export.export(m, inputs, strict=True).module()
    prepared = prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
    annotated = {
        n.name: repr(n.meta.get("quantization_annotation")) for n in prepared.graph.nodes
    }
    prepared(*inputs)
    converted = convert_pt2e(prepared, fold_quantize=True)
    rng_after = torch.get_rng_state().clone()
    ep = torch.export.export(converted, inputs, strict=True)
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer)
    return {
        "code": converted.code,
        "names": [n.name for n in converted.graph.nodes],
        "state": {k: v.clone() for k, v in converted.state_dict().items()},
        "prepared_code": prepared.code,
        "observers": sorted(
            (k, type(v).__name__, repr(v)) for k, v in prepared.named_modules() if k
        ),
        "annotated_nodes": sorted(k for k, v in annotated.items() if v != "None"),
        "rng": rng_after,
        "pte": pte,
    }


def _assert_same(local: dict[str, Any], remote: dict[str, Any]) -> None:
    assert remote["names"] == local["names"]
    assert remote["prepared_code"] == local["prepared_code"]
    assert remote["observers"] == local["observers"]
    assert remote["annotated_nodes"] == local["annotated_nodes"]
    assert remote["code"] == local["code"]
    assert remote["state"].keys() == local["state"].keys()
    for k, v in local["state"].items():
        assert torch.equal(remote["state"][k], v), k
    assert torch.equal(remote["rng"], local["rng"]), "the generator moved differently"
    assert remote["pte"] == local["pte"], (
        f"remote .pte ({len(remote['pte'])} B) differs from local ({len(local['pte'])} B)"
    )


CONFIGS = [
    ("xnnpack", {"is_per_channel": True}, ConvBnLinear),
    ("xnnpack", {"is_per_channel": False}, ConvBnLinear),
    ("xnnpack", {"is_per_channel": True, "is_dynamic": True}, ConvBnLinear),
    ("vulkan", {}, ConvBnLinear),
    ("xnnpack", {"is_per_channel": True}, sequential),
    ("xnnpack", {"is_per_channel": True}, InPlaceAndConstant),
]


@pytest.mark.parametrize(
    ("name", "spec", "model"), CONFIGS, ids=[f"{n}-{s}-{m.__name__}" for n, s, m in CONFIGS]
)
def test_remote_quantizer_gives_the_local_program_and_pte(
    server_address: str, name: str, spec: dict[str, Any], model: Callable[[], torch.nn.Module]
) -> None:
    local = _quantize_and_lower(_local_quantizer(name, spec), _local_partitioner(name), model)
    assert local["annotated_nodes"], "nothing was annotated: the comparison would prove little"
    quantizer = RemoteQuantizer(server_address, name, spec, timeout=600)
    remote = _quantize_and_lower(
        quantizer, RemotePartitioner(server_address, name, timeout=600), model
    )
    _assert_same(local, remote)
    # Weights stay home: the steps decide from the graph, shapes and dtypes.
    assert quantizer.stats["tensor_bytes_uploaded"] == 0


def test_the_generator_state_is_carried(server_address: str) -> None:
    """XNNPACK's static configs draw random example inputs while annotating: the client's
    generator ends where the local quantizer leaves it, and the draws happen on the server
    from the client's state (a different starting state gives a different end state)."""
    spec = {"is_per_channel": True}
    torch.manual_seed(1)
    start = torch.get_rng_state()
    gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
    torch.set_rng_state(start)
    prepare_pt2e(gm, _local_quantizer("xnnpack", spec))  # type: ignore[arg-type]
    local_after = torch.get_rng_state()
    assert not torch.equal(local_after, start), "the local quantizer drew nothing"
    gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
    torch.set_rng_state(start)
    prepare_pt2e(gm, RemoteQuantizer(server_address, "xnnpack", spec))  # type: ignore[arg-type]
    assert torch.equal(torch.get_rng_state(), local_after)


def test_annotate_alone(server_address: str) -> None:
    """``annotate`` called without ``transform_for_annotation`` asks the server for the
    annotate step alone and gives the local annotations."""
    spec = {"is_per_channel": True}
    inputs = (torch.randn(2, 3, 8, 8),)

    def annotations(quantizer: Quantizer) -> list[tuple[str, str]]:
        torch.manual_seed(0)
        gm = torch.export.export(ConvBnLinear().eval(), inputs).module()
        quantizer.annotate(gm)
        return [(n.name, repr(n.meta.get("quantization_annotation"))) for n in gm.graph.nodes]

    local = annotations(_local_quantizer("xnnpack", spec))
    assert any(a != "None" for _, a in local)
    remote = annotations(RemoteQuantizer(server_address, "xnnpack", spec))
    # Reprs name the observer constructors' addresses; compare what they say besides.
    strip = _strip_addresses
    assert [(n, strip(a)) for n, a in remote] == [(n, strip(a)) for n, a in local]


def _strip_addresses(text: str) -> str:
    import re

    return re.sub(r" at 0x[0-9a-f]+", "", text)


def test_listing_names_the_hosted_quantizers(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        listing = pb_grpc.RemotePartitionerStub(channel).ListPartitioners(
            pb.ListPartitionersRequest(), timeout=60
        )
    by_name = {q.name: q for q in listing.quantizers}
    assert {"xnnpack", "vulkan"} <= by_name.keys()
    xnnpack = by_name["xnnpack"]
    assert xnnpack.class_name.endswith("XNNPACKQuantizer")
    assert xnnpack.backend_id == "XnnpackBackend"
    assert {"is_per_channel", "is_dynamic", "is_qat"} <= {k.name for k in xnnpack.spec_keys}
    assert all(k.doc for k in xnnpack.spec_keys)


def test_unknown_quantizer_and_bad_spec(server_address: str) -> None:
    gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
    with pytest.raises(QuantizerNotFoundError, match=r"hosted: .*xnnpack"):
        RemoteQuantizer(server_address, "nope").transform_for_annotation(gm)
    for spec, key in (({"no_such_key": True}, "no_such_key"),
                      ({"is_per_channel": "yes"}, "is_per_channel")):
        with pytest.raises(InvalidSpecError, match=key):
            RemoteQuantizer(server_address, "xnnpack", spec).transform_for_annotation(gm)
    # On the wire, without the client's own check: NOT_FOUND, UNKNOWN_QUANTIZER.
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Quantize(pb.QuantizeRequest(quantizer=pb.QuantizerRef(name="nope")), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "UNKNOWN_QUANTIZER" in str(e.value.trailing_metadata())
        assert "xnnpack" in (e.value.details() or "")
    # The server keeps serving: the same module quantizes afterwards.
    q = RemoteQuantizer(server_address, "xnnpack", {"is_per_channel": True})
    prepared = prepare_pt2e(gm, q)  # type: ignore[arg-type]
    assert any("quantization_annotation" in n.meta for n in prepared.graph.nodes)


def test_a_module_the_server_rebuilds_differently_is_refused(server_address: str) -> None:
    """The unlift table carries the client's fingerprint; a request whose module does not
    match it is FAILED_PRECONDITION, FINGERPRINT_MISMATCH."""
    from remote_partitioner.proto import codec

    gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
    ep, table = codec.lift_module(gm)
    table.fingerprint = "0" * 64
    encoded = codec.encode_program(ep)
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        for h, data in encoded.blobs.items():
            stub.UploadBlobs(
                iter([pb.UploadBlobsRequest(
                    digest=pb.Digest(hash=h, size_bytes=len(data)), offset=0, data=bytes(data),
                )]),
                timeout=60,
            )
        with pytest.raises(grpc.RpcError) as e:
            stub.Quantize(
                pb.QuantizeRequest(
                    quantizer=pb.QuantizerRef(name="xnnpack"), program=encoded.message,
                    unlift=table,
                ),
                timeout=120,
            )
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "FINGERPRINT_MISMATCH" in str(e.value.trailing_metadata())


# ------------------------------------------------------------------ no backend packages

CLIENT = textwrap.dedent("""
    import json, warnings
    warnings.filterwarnings("ignore")
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from remote_partitioner.client import RemotePartitioner, RemoteQuantizer

    target, path, name, spec, out = sys.argv[1:6]
    spec = json.loads(spec)
    ep = torch.export.load(path)
    torch.manual_seed(0)
    inputs = ep.example_inputs[0]
    prepared = prepare_pt2e(ep.module(), RemoteQuantizer(target, name, spec, timeout=900))
    prepared(*inputs)
    converted = convert_pt2e(prepared, fold_quantize=True)
    lowered = to_edge_transform_and_lower(
        torch.export.export(converted, inputs, strict=True),
        partitioner=[RemotePartitioner(target, name, timeout=900)],
    )
    with open(out, "wb") as fh:
        fh.write(lowered.to_executorch().buffer)
    print(json.dumps({"backends_loaded": sorted(m for m in sys.modules if m.startswith(_BLOCKED))}))
""")


@slow  # a client process (about 20 s of imports), then the local run
@pytest.mark.parametrize(("name", "spec"), [("xnnpack", {"is_per_channel": True})])
def test_a_process_without_backends_quantizes_and_lowers(
    server_address: str, tmp_path: Path, name: str, spec: dict[str, Any]
) -> None:
    from test_preprocess import BLOCK_BACKENDS

    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 8, 8),)
    ep = torch.export.export(ConvBnLinear().eval(), inputs, strict=True)
    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    out = tmp_path / "remote.pte"
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_BACKENDS + CLIENT, server_address, str(path), name,
         json.dumps(spec), str(out)],
        capture_output=True, text=True, timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["backends_loaded"] == []
    # The same steps here, with the local quantizer and partitioner.
    loaded = torch.export.load(path)
    torch.manual_seed(0)
    prepared = prepare_pt2e(loaded.module(), _local_quantizer(name, spec))  # type: ignore[arg-type]
    prepared(*inputs)
    converted = convert_pt2e(prepared, fold_quantize=True)
    local = bytes(
        to_edge_transform_and_lower(
            torch.export.export(converted, inputs, strict=True),
            partitioner=[_local_partitioner(name)],
        ).to_executorch().buffer
    )
    remote = out.read_bytes()
    assert remote == local, f"remote .pte ({len(remote)} B) differs from local ({len(local)} B)"


def test_a_module_annotated_before_is_refused(server_address: str) -> None:
    """In a ComposableQuantizer after a local quantizer, the module arrives annotated; the
    annotations would not reach the server, so the call is refused rather than answered
    differently from local."""
    from torchao.quantization.pt2e.quantizer import ComposableQuantizer

    gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
    composed = ComposableQuantizer([
        _local_quantizer("vulkan", {}), RemoteQuantizer(server_address, "xnnpack"),
    ])
    with pytest.raises(ValueError, match="already annotated"):
        prepare_pt2e(gm, composed)  # type: ignore[arg-type]


class _DrawsThenRaises(Quantizer):
    """A quantizer whose transform adds a constant (as XNNPACK's does) and whose annotate
    draws from the generator, then raises."""

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import (
            _convert_scalars_to_attrs,
        )

        return _convert_scalars_to_attrs(model)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        torch.randn(7)
        raise IndexError("no pattern for node 'linear'")

    def validate(self, model: torch.fx.GraphModule) -> None:
        pass


def test_a_step_that_raises_raises_at_the_same_step() -> None:
    """The exception comes back at ``annotate`` (after the transform's edits were applied, as
    locally), with its class and message, and the generator as the step left it."""
    from servers import inproc_server

    from remote_partitioner.server.quantizers import HostedQuantizer, QuantizerRegistry

    hosted = HostedQuantizer("raises", "XnnpackBackend", {}, lambda spec: _DrawsThenRaises(),
                             _DrawsThenRaises)

    def run(quantizer: Quantizer) -> tuple[str, str, torch.Tensor]:
        torch.manual_seed(3)
        gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
        with pytest.raises(IndexError, match="no pattern for node 'linear'") as e:
            prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
        # The quantizer method the exception left: the step it was raised at.
        steps = [t.name for t in e.traceback if t.name in ("transform_for_annotation",
                                                          "annotate", "validate")]
        return gm.code, steps[-1], torch.get_rng_state()

    local_code, local_step, local_rng = run(_DrawsThenRaises())
    assert local_step == "annotate" and "_tensor_constant" in local_code
    with inproc_server(quantizers=QuantizerRegistry([hosted])) as (_, target):
        remote = RemoteQuantizer(target, "raises")
        code, step, rng = run(remote)
    assert step == "annotate"
    assert code == local_code
    assert torch.equal(rng, local_rng)


class _DrawsInAnnotate(Quantizer):
    """Annotates nothing; annotate draws from the generator (as XNNPACK's and Core ML's do)
    and validate raises when the module has no linear."""

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        torch.randn(3)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        if not any("linear" in n.name for n in model.graph.nodes):
            raise ValueError("no linear to quantize")


def test_steps_called_one_by_one() -> None:
    """Draws between the transform and annotate (user code, another quantizer's transform)
    reach the server's annotate as they reach a local one; validate raises only what the
    hosted validate raised; a module dropped between the steps takes its answer with it."""
    import gc

    from servers import inproc_server

    from remote_partitioner.server.quantizers import HostedQuantizer, QuantizerRegistry

    hosted = HostedQuantizer("draws", "XnnpackBackend", {}, lambda spec: _DrawsInAnnotate(),
                             _DrawsInAnnotate)

    def steps(quantizer: Quantizer, model: torch.nn.Module, draw_between: bool) -> Any:
        torch.manual_seed(5)
        gm = torch.export.export(model.eval(), (torch.randn(2, 3, 8, 8),)).module()
        quantizer.transform_for_annotation(gm)
        if draw_between:
            torch.randn(10)
        quantizer.annotate(gm)
        after = torch.get_rng_state()
        try:
            quantizer.validate(gm)
        except ValueError as e:
            return after, str(e)
        return after, None

    with inproc_server(quantizers=QuantizerRegistry([hosted])) as (_, target):
        remote = RemoteQuantizer(target, "draws")
        for draw_between in (False, True):
            assert torch.equal(
                steps(remote, ConvBnLinear(), draw_between)[0],
                steps(_DrawsInAnnotate(), ConvBnLinear(), draw_between)[0],
            )
        # Validate raises only when the hosted validate raised.
        assert steps(remote, ConvBnLinear(), False)[1] is None
        no_linear = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
        assert steps(remote, no_linear, False)[1] == "no linear to quantize"
        # Transforms without annotate leave nothing behind once their modules are gone.
        for _ in range(3):
            gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
            remote.transform_for_annotation(gm)
        del gm
        gc.collect()
        assert len(remote._pending) == 0


@pytest.mark.usefixtures("torchao_qat_memo")  # the local run exports, the remote one copies
def test_qat_gives_the_local_program(server_address: str) -> None:
    """QAT: a module exported in training mode updates batch norm's buffers in place
    (``add_``), which torch.export's training dialect allows; ``prepare_qat_pt2e`` with the
    remote quantizer, training steps and ``convert_pt2e`` give the local prepared and converted
    code, tensors and generator state."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    def qat(quantizer: Quantizer) -> tuple[str, str, dict[str, torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        gm = torch.export.export(ConvBnLinear().train(), (torch.randn(2, 3, 8, 8),)).module()
        assert any(str(n.target) == "aten.add_.Tensor" for n in gm.graph.nodes)
        prepared = prepare_qat_pt2e(gm, quantizer)  # type: ignore[arg-type]
        for _ in range(3):
            prepared(torch.randn(2, 3, 8, 8))
        converted = convert_pt2e(prepared)
        state = {k: v.clone() for k, v in converted.state_dict().items()}
        return prepared.code, converted.code, state, torch.get_rng_state()

    spec = {"is_per_channel": True, "is_qat": True}
    local = qat(_local_quantizer("xnnpack", spec))
    remote = qat(RemoteQuantizer(server_address, "xnnpack", spec))
    assert remote[:2] == local[:2]
    assert remote[2].keys() == local[2].keys()
    for k, v in local[2].items():
        assert torch.equal(remote[2][k], v), k
    assert torch.equal(remote[3], local[3])


class _Mark(dict):  # type: ignore[type-arg]
    """A dict subclass for node metadata, as Arm's ``ArmAnnotationInfo`` is."""


class _RewritesAndMarks(Quantizer):
    """XNNPACK's symmetric quantizer behind a transform that rewrites the graph as Arm's pass
    pipeline does (each relu becomes a new ``clamp`` node; more than edits state) and an
    annotate that marks the nodes it annotated in plain-data metadata, as Arm's does
    (``custom``, ``disallow_tfa``)."""

    def __init__(self) -> None:
        super().__init__()
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        self.inner = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = self.inner.transform_for_annotation(model)
        for node in list(model.graph.nodes):
            if node.target == torch.ops.aten.relu.default:
                with model.graph.inserting_after(node):
                    clamp = model.graph.call_function(
                        torch.ops.aten.clamp.default, (node.args[0], 0.0)
                    )
                clamp.meta = dict(node.meta)
                node.replace_all_uses_with(clamp)
                model.graph.erase_node(node)
        model.recompile()
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        self.inner.annotate(model)
        for node in model.graph.nodes:
            annotated = node.meta.get("quantization_annotation") is not None
            if node.op == "call_function":
                node.meta["custom"] = {"mark": _Mark(quantized=annotated)}
                node.meta["disallow_tfa"] = not annotated
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        self.inner.validate(model)


def test_a_transform_returned_whole_and_metadata_marks() -> None:
    """A transform that changes more than edits state comes back as its whole module, which
    the client continues with (as prepare_pt2e continues with the module a local transform
    returns); the plain-data metadata annotate writes crosses (a dict subclass arrives as a
    dict); the program, the generator and the .pte are the local ones."""
    from servers import inproc_server

    from remote_partitioner.server.quantizers import HostedQuantizer, QuantizerRegistry

    hosted = HostedQuantizer("rewrites", "XnnpackBackend", {}, lambda spec: _RewritesAndMarks(),
                             _RewritesAndMarks)
    local = _quantize_and_lower(_RewritesAndMarks(), _local_partitioner("xnnpack"))
    assert "clamp" in local["prepared_code"] and "relu" not in local["prepared_code"]
    with inproc_server(quantizers=QuantizerRegistry([hosted])) as (_, target):
        remote_quantizer = RemoteQuantizer(target, "rewrites")
        remote = _quantize_and_lower(remote_quantizer, _local_partitioner("xnnpack"))
        _assert_same(local, remote)

        # The module came back whole (not the client's, edited), with the marks.
        gm = torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
        out = remote_quantizer.transform_for_annotation(gm)
        assert out is not gm
        remote_quantizer.annotate(out)
        want = _RewritesAndMarks().annotate(_RewritesAndMarks().transform_for_annotation(
            torch.export.export(ConvBnLinear().eval(), (torch.randn(2, 3, 8, 8),)).module()
        ))
        marks = {n.name: (n.meta.get("custom"), n.meta.get("disallow_tfa"))
                 for n in want.graph.nodes if n.op == "call_function"}
        assert {n.name: (n.meta.get("custom"), n.meta.get("disallow_tfa"))
                for n in out.graph.nodes if n.op == "call_function"} == marks
        assert any(m[0]["mark"]["quantized"] for m in marks.values())
