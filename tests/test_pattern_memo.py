"""The pattern graph memos (``remote_partitioner.server.pattern_memo``) that ``remote-partitioner
serve`` installs: the same graphs, node names and random numbers as ExecuTorch's own builds, the
same quantized program from the XNNPACK quantizer, and a memoized server lowers to the ``.pte``
an unmemoized local lowering gives."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from models import small_models
from torch.export import ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.server.pattern_memo import (
    memoize_vulkan_pattern_graphs,
    memoize_xnnpack_pattern_graphs,
)

pytest.importorskip("executorch.backends.vulkan.patterns")


def _counted(export: Callable[..., object], exports: list[object]) -> Callable[..., object]:
    """``export``, appending the pattern (its first argument) to ``exports`` on each call."""

    def export_counted(*args: object, **kwargs: object) -> object:
        exports.append(args[0])
        return export(*args, **kwargs)

    return export_counted


@pytest.mark.slow  # builds the patterns four times (> 10 s)
def test_memoized_vulkan_pattern_graphs_are_the_same() -> None:
    """From the same seed, Vulkan's registered pattern functions give the same graphs (code,
    node names and targets), and leave the same random generator, without the memo, on its
    first use (a miss) and from the memo alone (a hit: nothing exported); and the memo can
    be taken out again."""
    from executorch.backends.vulkan.patterns import fusable_patterns, rope, rope_hf

    assert not getattr(rope.to_edge, "memoized", False), "this process must start unmemoized"
    functions = [e.get_graphs_fn for e in fusable_patterns.values() if e.get_graphs_fn]
    assert {f.__name__ for f in functions} >= {"get_rope_graphs", "get_hf_rope_graphs"}

    def graphs() -> tuple[list[str], list[list[tuple[str, str]]], torch.Tensor]:
        torch.manual_seed(11)
        built = [g for f in functions for g in f()]
        nodes = [[(n.name, str(n.target)) for n in g.graph.nodes] for g in built]
        return [g.code for g in built], nodes, torch.get_rng_state()

    original = rope.export
    exports: list[object] = []
    export_counted = _counted(original, exports)

    rope.export = rope_hf.export = export_counted
    try:
        code, nodes, rng = graphs()
        unmemoized = len(exports)
        assert unmemoized >= 3
        restore = memoize_vulkan_pattern_graphs()
        assert restore is not None
        try:
            assert memoize_vulkan_pattern_graphs() is not None  # installing twice: a no-op
            for expected_exports in (2 * unmemoized, 2 * unmemoized):  # a miss, then a hit
                memo_code, memo_nodes, memo_rng = graphs()
                assert len(exports) == expected_exports
                assert memo_code == code
                assert memo_nodes == nodes
                assert torch.equal(memo_rng, rng)
        finally:
            restore()
        graphs()
        assert len(exports) == 3 * unmemoized  # exported again once restored
    finally:
        rope.export = rope_hf.export = original


def _conv() -> ExportedProgram:
    model, inputs = small_models()["conv"]
    torch.manual_seed(0)
    return export(model.eval(), inputs, strict=True)


@pytest.mark.slow  # three Vulkan lowerings, the local one unmemoized (> 5 s)
def test_memoized_server_lowers_to_the_unmemoized_local_pte(server_address: str) -> None:
    """The server (which has the memo) partitions and preprocesses for Vulkan, twice (its
    memo misses, then hits): each time the ``.pte`` and the random generator after lowering
    are those of a local lowering in this process, which has no memo."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.backends.vulkan.patterns import rope
    from executorch.exir import to_edge_transform_and_lower

    assert not getattr(rope.to_edge, "memoized", False), "the local lowering must be unmemoized"
    ep = _conv()
    torch.manual_seed(5)
    local = to_edge_transform_and_lower(
        copy.deepcopy(ep), partitioner=[VulkanPartitioner()]
    ).to_executorch().buffer
    local_next = torch.randn(8)
    for _ in range(2):
        remote = RemotePartitioner(server_address, "vulkan", remote_preprocess=True, timeout=600)
        torch.manual_seed(5)
        got = to_edge_transform_and_lower(
            copy.deepcopy(ep), partitioner=[remote]
        ).to_executorch().buffer
        assert got == local
        assert torch.equal(torch.randn(8), local_next)
        assert remote.stats["preprocess_calls"] >= 1


class _ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def _xnnpack_static_per_channel() -> tuple[str, dict[str, torch.Tensor], torch.Tensor]:
    """A conv-bn-relu model through XNNPACK's static per-channel prepare_pt2e, calibration and
    convert_pt2e from seed 13: the converted code, its state dict, the generator after."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(13)
    model = _ConvBnRelu().eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    config = get_symmetric_quantization_config(is_per_channel=True)
    captured = export(model, inputs, strict=True).module()
    prepared = prepare_pt2e(captured, XNNPACKQuantizer().set_global(config))  # type: ignore[arg-type]
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    state = {k: v.clone() for k, v in converted.state_dict().items()}
    return converted.code, state, torch.get_rng_state()


def test_memoized_xnnpack_quantizer_patterns_quantize_the_same() -> None:
    """XNNPACK's quantizer exports its conv-bn[-relu] patterns on every ``prepare_pt2e``; with
    the memo, the first quantization exports each (a miss) and the second none (a hit), and
    both give the converted code, state dict and random generator of the unmemoized one (run
    first); the memo can be taken out again."""
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils as utils

    original = utils._get_aten_graph_module_for_pattern
    assert not getattr(original, "memoized", False), "this process must start unmemoized"
    exports: list[object] = []
    export_counted = _counted(original, exports)

    utils._get_aten_graph_module_for_pattern = export_counted
    try:
        code, state, rng = _xnnpack_static_per_channel()
        unmemoized = len(exports)
        assert unmemoized >= 4
        restore = memoize_xnnpack_pattern_graphs()
        assert restore is not None
        try:
            assert memoize_xnnpack_pattern_graphs() is not None  # installing twice: a no-op
            for expected_exports in (2 * unmemoized, 2 * unmemoized):  # a miss, then a hit
                memo_code, memo_state, memo_rng = _xnnpack_static_per_channel()
                assert len(exports) == expected_exports
                assert memo_code == code
                assert memo_state.keys() == state.keys()
                assert all(torch.equal(memo_state[k], state[k]) for k in state)
                assert torch.equal(memo_rng, rng)
        finally:
            restore()
        assert utils._get_aten_graph_module_for_pattern is export_counted
        _xnnpack_static_per_channel()
        assert len(exports) == 3 * unmemoized  # exported again once restored
    finally:
        utils._get_aten_graph_module_for_pattern = original


def test_memoized_torchao_qat_patterns_are_fresh_exports() -> None:
    """torchao's QAT conv-bn patterns, as ``convert_pt2e`` exports them (a per-channel pattern
    with its scales, zero points and conv bias as keyword inputs, drawn anew each time): the
    second build of a pattern is a hit (nothing exported) whose graph is the one a fresh
    export gives, a pattern with other flags or other input shapes is a miss, and the memo can
    be taken out again."""
    import torch.nn.functional as F
    from torchao.quantization.pt2e import qat_utils

    from remote_partitioner.server.pattern_memo import memoize_torchao_qat_pattern_graphs

    original = qat_utils._get_aten_graph_module_for_pattern
    assert not getattr(original, "memoized", False), "this process must start unmemoized"
    exports: list[object] = []
    export_counted = _counted(original, exports)

    def build(bn_is_training: bool, conv_dims: int = 2) -> tuple[list[tuple[str, str]], str]:
        """A pattern's graph, built as ``_fold_conv_bn_qat`` builds it: its example inputs
        and keyword inputs drawn anew."""
        example_inputs = (torch.randn(1, 1, *[3] * conv_dims),  # x
                          torch.randn(1, 1, *[1] * conv_dims),  # conv_weight
                          *(torch.randn(1) for _ in range(4)))  # bn's weight, bias, mean, var
        kwargs = qat_utils._get_quantized_conv_bn_example_inputs_kwargs(True, True, True, False)
        pattern = qat_utils._get_quantized_qat_conv_bn_pattern(
            True, True, True, F.conv2d if conv_dims == 2 else F.conv1d, bn_is_training)
        graph = qat_utils._get_aten_graph_module_for_pattern(
            pattern, example_inputs, False, **kwargs)
        return [(n.name, str(n.target)) for n in graph.graph.nodes], graph.code

    qat_utils._get_aten_graph_module_for_pattern = export_counted
    try:
        fresh = build(False)
        restore = memoize_torchao_qat_pattern_graphs()
        assert restore is not None
        try:
            assert memoize_torchao_qat_pattern_graphs() is not None  # installing twice: a no-op
            assert build(False) == fresh and len(exports) == 2  # a miss
            assert build(False) == fresh and len(exports) == 2  # a hit
            assert build(True) != fresh and len(exports) == 3  # other flags
            build(False, conv_dims=1)
            assert len(exports) == 4  # other input shapes
        finally:
            restore()
        assert qat_utils._get_aten_graph_module_for_pattern is export_counted
        assert build(False) == fresh and len(exports) == 5
    finally:
        qat_utils._get_aten_graph_module_for_pattern = original
