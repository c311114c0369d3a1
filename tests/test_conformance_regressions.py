"""Regressions found by running ExecuTorch's backend conformance suite with remote twin flows
(``scripts/conformance.py``), one test per class of bug:

* node names of multi-output nodes: exir's deserializer names a node that returns several
  values (``split_with_sizes_copy``, a delegate call with several outputs) by FX's counter in
  reading order, not by the name the JSON records, so two such nodes of one operator swapped
  names on the server (``test_lstm.py::test_lstm_bidirectional``: "Argument 'getitem_117' of
  Node 'aten_split_with_sizes_copy_default_10' was used before it has been defined!");
* the random generator: a hook that draws from torch's global generator must leave the caller's
  process in the state the local hook would have (the state crosses with the call and back);
* the hints of derived dims' root symbols: a dimension exported as ``Dim("h") * 16`` crosses as
  the expression ``16*s`` and its hint, and the server's shape environment had no hint for
  ``s``; XNNPACK's check of a size ``floor(s/2) - 1`` then raised a data-dependent error there
  (``test_torchvision.py::test_alexnet`` with dynamic shapes: "KeyError: 's89'").
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch
from conftest import _serve, plugin_distribution  # (tests/ is on sys.path, as for certs.py)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from torch.export import Dim, ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.proto import codec

#: Each test lowers a model or starts a server of its own: `make test` runs them, `make
#: test-fast` does not.
pytestmark = pytest.mark.slow


class _BiLSTM(torch.nn.Module):
    """The model of the suite's ``test_lstm_bidirectional``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(64, 32, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def _bilstm() -> ExportedProgram:
    torch.manual_seed(0)
    return export(_BiLSTM().eval(), (torch.randn(1, 10, 64),), strict=True)


@pytest.fixture(scope="module")
def local_bilstm() -> tuple[bytes, list[ExportedProgram]]:
    """The bidirectional LSTM lowered by the local XNNPACK partitioner: its ``.pte``, and every
    program ``to_edge_transform_and_lower`` handed the partitioner's ``ops_to_not_decompose``
    (the last ones hold delegates whose outputs feed several ``split_with_sizes_copy``
    nodes)."""
    seen: list[ExportedProgram] = []

    class Recording(XnnpackPartitioner):  # type: ignore[misc]
        def ops_to_not_decompose(self, ep: ExportedProgram) -> object:
            seen.append(copy.deepcopy(ep))  # as handed (to_executorch changes it later)
            return super().ops_to_not_decompose(ep)

    pte = to_edge_transform_and_lower(_bilstm(), partitioner=[Recording()]).to_executorch().buffer
    return bytes(pte), seen


def test_multi_output_node_names_survive_edge_round_trip(
    local_bilstm: tuple[bytes, list[ExportedProgram]],
) -> None:
    """Every program ``to_edge_transform_and_lower`` hands ``ops_to_not_decompose`` decodes
    with the client's node names, the multi-output nodes included."""
    _, seen = local_bilstm
    edge_with_delegates = [
        ep for ep in seen
        if any("executorch_call_delegate" in str(n.target) for n in ep.graph.nodes)
    ]
    assert edge_with_delegates, "no Edge program with delegates was seen"
    for ep in seen:
        encoded = codec.encode_program(ep)
        blobs = dict(encoded.blobs)
        decoded = codec.decode_program(encoded.message, lambda d, b=blobs: b[d.hash])
        split = [n.name for n in ep.graph.nodes if "split_with_sizes" in str(n.target)]
        assert [n.name for n in decoded.graph.nodes if "split_with_sizes" in str(n.target)] == split
        for name in split:
            original = next(n for n in ep.graph.nodes if n.name == name)
            rebuilt = next(n for n in decoded.graph.nodes if n.name == name)
            # The same node: it reads the value of the same name.
            assert [a.name for a in rebuilt.all_input_nodes] == [
                a.name for a in original.all_input_nodes
            ]


def test_bidirectional_lstm_lowers_identically(
    server_address: str, local_bilstm: tuple[bytes, list[ExportedProgram]],
) -> None:
    local, _ = local_bilstm
    remote = to_edge_transform_and_lower(
        _bilstm(), partitioner=[RemotePartitioner(server_address, "xnnpack")]
    ).to_executorch().buffer
    assert remote == local


# --- the random generator ------------------------------------------------------------------

_PLUGIN = '''
"""A hosted XNNPACK partitioner whose hooks draw from torch's global generator."""
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from remote_partitioner.server.registry import HostedPartitioner


class DrawingXnnpackPartitioner(XnnpackPartitioner):
    def ops_to_not_decompose(self, ep):
        torch.rand(3)
        ops, check = super().ops_to_not_decompose(ep)
        return ops, check

    def partition(self, ep):
        torch.randn(5)
        return super().partition(ep)


PLUGIN = HostedPartitioner(
    "xnnpack_drawing", "XnnpackBackend", {}, lambda spec: DrawingXnnpackPartitioner(),
    DrawingXnnpackPartitioner, "XNNPACK, drawing random numbers in its hooks",
)
'''


@pytest.fixture(scope="module")
def drawing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, type]]:
    """A server hosting ``xnnpack_drawing`` and the backend ``DrawingBackend`` (entry-point
    plugins from two temporary distributions, ``_PLUGIN`` and ``_DRAWING_BACKEND``), and the
    plugin's partitioner class for the local lowering."""
    root = tmp_path_factory.mktemp("rng_plugin")
    with contextlib.ExitStack() as stack:
        stack.enter_context(plugin_distribution(
            root, "rp_rng_plugin", _PLUGIN, "xnnpack_drawing = rp_rng_plugin:PLUGIN"))
        stack.enter_context(plugin_distribution(
            root, "rp_rng_backend", _DRAWING_BACKEND, "drawing = rp_rng_backend:DrawingBackend",
            group="remote_partitioner.backends"))
        import rp_rng_backend  # type: ignore[import-not-found]  # noqa: F401 (the local class)
        import rp_rng_plugin  # type: ignore[import-not-found]

        _, target = stack.enter_context(_serve(tmp_path_factory))
        yield target, rp_rng_plugin.DrawingXnnpackPartitioner


def _linear() -> ExportedProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    return export(model, (torch.randn(2, 8),), strict=True)


def test_remote_hooks_leave_the_generator_as_local_ones(
    drawing_server: tuple[str, type],
) -> None:
    """Seed, lower, draw: the same numbers with the remote partitioner as with the local one,
    whose hooks draw; and the same ``.pte``."""
    target, drawing = drawing_server
    ep = _linear()
    # Once, so that what the first lowering in a process draws (preprocess's lazily built
    # patterns) is behind both measured lowerings.
    to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[XnnpackPartitioner()])

    torch.manual_seed(1234)
    local_pte = to_edge_transform_and_lower(
        copy.deepcopy(ep), partitioner=[drawing()]
    ).to_executorch().buffer
    local_next = torch.randn(4)

    torch.manual_seed(1234)
    plain = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[XnnpackPartitioner()])
    plain.to_executorch()
    undrawn_next = torch.randn(4)
    assert not torch.equal(local_next, undrawn_next), "the plugin's hooks draw nothing"

    remote = RemotePartitioner(target, "xnnpack_drawing")
    torch.manual_seed(1234)
    remote_pte = to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer
    remote_next = torch.randn(4)
    assert remote_pte == local_pte
    assert torch.equal(remote_next, local_next)


def test_server_refuses_a_malformed_generator_state(drawing_server: tuple[str, type]) -> None:
    import grpc

    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    target, _ = drawing_server
    encoded = codec.encode_program(_linear())
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.OpsToNotDecompose(
                pb.OpsToNotDecomposeRequest(
                    partitioner=pb.PartitionerRef(name="xnnpack"),
                    program=encoded.message, rng_state=b"\0" * 10,
                ),
                timeout=60,
            )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rng_state" in (info.value.details() or "")


_DRAWING_BACKEND = '''
"""A hosted backend whose preprocess draws from torch's global generator on every call."""
import torch
from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
from executorch.exir.backend.backend_details import BackendDetails


class DrawingBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        torch.randn(7)
        return XnnpackBackend.preprocess(edge_program, compile_specs)
'''


def test_remote_preprocess_leaves_the_generator_as_local_one(
    drawing_server: tuple[str, type],
) -> None:
    """Seed, preprocess on the server, draw: the numbers a local preprocess leaves. (Vulkan's
    preprocess draws on every call, while it traces its fusion patterns: the conformance
    suite run with --remote-preprocess found the generator differing after it.)"""
    from executorch.exir.backend.backend_api import to_backend

    from remote_partitioner.client import to_backend_remotely

    target, _ = drawing_server
    ep = to_edge(_linear()).exported_program()
    client = RemotePartitioner(target, "", timeout=600)
    # Once each, so that what the first preprocess in a process draws (XNNPACK's lazily built
    # patterns) is behind both measured ones, here and on the server.
    to_backend("DrawingBackend", copy.deepcopy(ep), [])
    to_backend_remotely(client, "DrawingBackend", copy.deepcopy(ep), [])
    torch.manual_seed(99)
    local = to_backend("DrawingBackend", copy.deepcopy(ep), [])
    local_next = torch.randn(4)
    torch.manual_seed(99)
    undrawn_next = torch.randn(4)
    assert not torch.equal(local_next, undrawn_next), "the backend draws nothing"
    torch.manual_seed(99)
    remote = to_backend_remotely(client, "DrawingBackend", ep, [])
    remote_next = torch.randn(4)
    assert client.stats["preprocess_calls"] == 2
    assert remote.processed_bytes == local.processed_bytes
    assert torch.equal(remote_next, local_next)


# --------------------------------------------------------------------------------------------
# A program returning one of torch's structseq types (torch.return_types.median): torch's
# serializer has no name for them, so the remote path failed at its first hook, where the
# local lowering goes on to ExecuTorch's own verdict (the suite's test_median_with_indices).


class _Median(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.return_types.median:
        return torch.median(x, dim=1, keepdim=True)


def test_a_structseq_output_crosses_and_torch_is_left_as_it_was() -> None:
    from torch.utils import _pytree as pytree

    ep = export(_Median(), (torch.randn(3, 4),), strict=True)
    assert ep.call_spec.out_spec.type is torch.return_types.median
    encoded = codec.encode_program(ep)
    back = codec.decode_program(encoded.message, lambda d: encoded.blobs[d.hash])
    assert back.call_spec.out_spec == ep.call_spec.out_spec
    # The names exist only while the codec runs: torch.export.save still refuses it.
    entry = pytree.SUPPORTED_SERIALIZED_TYPES[torch.return_types.median]
    assert entry.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND
    assert "torch.return_types.median" not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE


def test_a_structseq_output_fails_remotely_as_locally(server_address: str) -> None:
    ep = export(_Median(), (torch.randn(3, 4),), strict=True)
    with pytest.raises(Exception) as local:
        to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[XnnpackPartitioner()])
    with pytest.raises(Exception) as remote:
        to_edge_transform_and_lower(
            copy.deepcopy(ep), partitioner=[RemotePartitioner(server_address, "xnnpack")]
        )
    assert type(remote.value) is type(local.value)
    assert type(local.value).__name__ == "SpecViolationError"  # ExecuTorch's own verdict
    assert str(remote.value) == str(local.value)


# --- derived dims ----------------------------------------------------------------------------


class Pools(torch.nn.Module):
    """AlexNet's features, narrow: three convolution and max-pool stages, after which a side
    of ``16*s`` is ``floor(s/2) - 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, kernel_size=11, stride=4, padding=2), torch.nn.ReLU(),
            torch.nn.MaxPool2d(kernel_size=3, stride=2),
            torch.nn.Conv2d(8, 8, kernel_size=5, padding=2), torch.nn.ReLU(),
            torch.nn.MaxPool2d(kernel_size=3, stride=2),
            torch.nn.Conv2d(8, 8, kernel_size=3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.pool = torch.nn.AdaptiveAvgPool2d((2, 2))
        self.fc = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def derived_dims_program(quantized: bool = False) -> ExportedProgram:
    """``Pools`` exported as the suite's model tests export it (height and width ``Dim * 16``),
    with ``quantized``: first quantized as its quantized XNNPACK flows do (static, per
    channel)."""
    torch.manual_seed(0)
    model: torch.nn.Module = Pools().eval()
    inputs = (torch.randn(1, 3, 224, 224),)
    if quantized:
        from executorch.backends.transforms.duplicate_dynamic_quant_chain import (
            DuplicateDynamicQuantChainPass,
        )
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True))
        # (torch leaves the shape guards out of .module() when ExecuTorch's code calls it)
        captured = export(model, inputs, strict=True).module(check_guards=False)
        prepared = prepare_pt2e(captured, quantizer)
        prepared(*inputs)  # calibration
        model = convert_pt2e(prepared)
        DuplicateDynamicQuantChainPass()(model)  # (as the flows' quantize stage does)
    sides = {2: Dim("height", min=1, max=16) * 16, 3: Dim("width", min=1, max=16) * 16}
    return export(model, inputs, dynamic_shapes=(sides,), strict=True)


def test_derived_dims_lower_identically(server_address: str) -> None:
    """Quantized, XNNPACK asks whether the quantize node after the third max-pool is empty;
    the float program asks no such question the value ranges cannot answer."""
    program = derived_dims_program(quantized=True)
    local = to_edge_transform_and_lower(
        copy.deepcopy(program), partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    remote = to_edge_transform_and_lower(
        program, partitioner=[RemotePartitioner(server_address, "xnnpack")]
    ).to_executorch().buffer
    assert remote == local
