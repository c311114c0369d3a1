"""Tests for remote_partitioner.server.quantizers and the backends' ``hosted_quantizer()``,
against the real installed quantizers: each hosted quantizer builds, checks its spec as the
partitioner registry does, and quantizes exactly as the quantizer a user builds locally."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import plugin_distribution  # (tests/ is on sys.path)
from executorch.backends.vulkan.quantizer import vulkan_quantizer
from executorch.backends.xnnpack.quantizer import xnnpack_quantizer
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import Quantizer

from remote_partitioner.server import quantizers
from remote_partitioner.server.quantizers import (
    ENTRY_POINT_GROUP,
    HostedQuantizer,
    QuantizerRegistry,
    UnknownQuantizerError,
    builtin_quantizers,
    default_quantizers,
)
from remote_partitioner.server.registry import InvalidSpecError, SpecKey, key_table


@pytest.fixture(scope="module")
def hosted() -> QuantizerRegistry:
    return builtin_quantizers()


#: A valid value other than the default for every spec key of every built-in quantizer.
EVERY_KEY: dict[str, dict[str, Any]] = {
    "xnnpack": {
        "is_per_channel": True, "is_qat": True, "is_dynamic": True, "act_qmin": -100,
        "act_qmax": 100, "weight_qmin": -100, "weight_qmax": 100,
    },
    "vulkan": {
        "is_dynamic": True, "weight_bits": 4, "act_bits": 8, "act_qmin": -100, "act_qmax": 100,
        "weight_qmin": -8, "weight_qmax": 7,
    },
    "coreml": {
        "quantization_scheme": "affine", "activation_dtype": "float32", "weight_dtype": "quint8",
        "weight_per_channel": False, "weight_observer": "min_max",
        "activation_observer": "MIN_MAX",  # (member names are case-insensitive)
    },
}


def test_builtin_quantizers_are_hosted_in_backend_order(hosted: QuantizerRegistry) -> None:
    assert hosted.names() == ["coreml", "vulkan", "xnnpack"]
    assert len(hosted) == 3
    assert [h.name for h in hosted] == ["coreml", "vulkan", "xnnpack"]
    assert "xnnpack" in hosted and "qnn" not in hosted
    assert {h.name: h.backend_id for h in hosted} == {
        "coreml": "CoreMLBackend", "vulkan": "VulkanBackend", "xnnpack": "XnnpackBackend"}
    for h in hosted:
        assert set(EVERY_KEY[h.name]) == set(h.spec_keys), h.name
        assert h.description
        for key in h.spec_keys.values():
            assert key.doc and "\n" not in key.doc and len(key.doc) <= 80, key


@pytest.mark.parametrize("name", ["xnnpack", "vulkan", "coreml"])
def test_builds_with_defaults_and_with_every_key(hosted: QuantizerRegistry, name: str) -> None:
    h = hosted.get(name)
    first, second = h.build({}), hosted.build(name, EVERY_KEY[name])
    for q in (first, second, h.create({})):
        assert type(q) is h.quantizer_class
        assert isinstance(q, Quantizer)
    assert first is not h.build({})  # a fresh quantizer per call
    for key in h.spec_keys:  # and each key alone
        assert type(h.build({key: EVERY_KEY[name][key]})) is h.quantizer_class


def test_xnnpack_and_vulkan_configs_are_the_functions_own(hosted: QuantizerRegistry) -> None:
    """The config is what ``get_symmetric_quantization_config`` returns for the keys sent, as
    keywords in its parameter order (``lru_cache``d: the very object), whatever the spec's
    order; an empty spec calls it without arguments."""
    xnn = xnnpack_quantizer.get_symmetric_quantization_config
    vk = vulkan_quantizer.get_symmetric_quantization_config
    assert hosted.build("xnnpack", {}).global_config is xnn()  # type: ignore[attr-defined]
    got = hosted.build("xnnpack", {"is_dynamic": True, "is_per_channel": True})
    assert got.global_config is xnn(is_per_channel=True, is_dynamic=True)  # type: ignore[attr-defined]
    every = dict(reversed(EVERY_KEY["xnnpack"].items()))
    assert hosted.build("xnnpack", every).global_config is xnn(  # type: ignore[attr-defined]
        **EVERY_KEY["xnnpack"])
    assert hosted.build("vulkan", {}).global_config is vk()  # type: ignore[attr-defined]
    got = hosted.build("vulkan", EVERY_KEY["vulkan"])
    assert got.global_config is vk(**EVERY_KEY["vulkan"])  # type: ignore[attr-defined]


def test_coreml_config_is_the_testers(hosted: QuantizerRegistry) -> None:
    """An empty spec is ExecuTorch's Core ML tester's quantizer: a ``CoreMLQuantizer`` of its
    config; the keys replace its entries. (That quantizer quantizes over the wire as it does
    locally: tests/test_annotations.py::test_coreml. Each Core ML ``annotate`` exports 405
    pattern graphs, about 48 s here, so the registry's is not run a second time.)"""
    from coremltools.optimize.torch.quantization import ModuleLinearQuantizerConfig
    from executorch.backends.apple.coreml.quantizer import CoreMLQuantizer
    from executorch.backends.apple.coreml.test.tester import _get_static_int8_linear_qconfig

    quantizer = hosted.build("coreml", {})
    assert type(quantizer) is CoreMLQuantizer
    built = quantizer._config  # type: ignore[attr-defined]
    assert built == _get_static_int8_linear_qconfig()
    every = hosted.build("coreml", EVERY_KEY["coreml"])._config  # type: ignore[attr-defined]
    assert every.global_config == ModuleLinearQuantizerConfig(
        quantization_scheme="affine", activation_dtype=torch.float32, weight_dtype=torch.quint8,
        weight_per_channel=False, weight_observer="min_max", activation_observer="min_max")


@pytest.mark.parametrize(
    ("name", "spec", "key", "expected"),
    [
        ("xnnpack", {"per_channel": True}, "per_channel", ""),
        ("xnnpack", {"is_per_channel": 1}, "is_per_channel", "bool"),
        ("xnnpack", {"act_qmin": True}, "act_qmin", "int"),
        ("xnnpack", {"act_qmin": -128.0}, "act_qmin", "int"),
        ("xnnpack", {"weight_qmax": 128}, "weight_qmax", "int"),
        ("xnnpack", {"act_qmin": 10, "act_qmax": 5}, "act_qmax", "int"),
        ("xnnpack", {"weight_qmax": -128}, "weight_qmax", "int"),  # below the default qmin
        ("vulkan", {"weight_bits": 6}, "weight_bits", "int"),
        ("vulkan", {"act_bits": 4}, "act_bits", "int"),
        ("vulkan", {"is_dynamic": "yes"}, "is_dynamic", "bool"),
        ("coreml", {"weight_dtype": "int4"}, "weight_dtype", "str"),
        ("coreml", {"activation_dtype": "qint8"}, "activation_dtype", "str"),
        ("coreml", {"weight_observer": "ema_min_max"}, "weight_observer", "str"),
        ("coreml", {"milestones": "0,1,2,3"}, "milestones", ""),
        ("coreml", {"weight_per_channel": b"1"}, "weight_per_channel", "bool"),
    ],
)
def test_bad_specs_are_rejected_as_the_partitioner_registry_does(
    hosted: QuantizerRegistry, name: str, spec: dict[str, Any], key: str, expected: str
) -> None:
    with pytest.raises(InvalidSpecError) as e:
        hosted.build(name, spec)
    assert (e.value.key, e.value.expected) == (key, expected)
    assert str(e.value).startswith(f"{name}: ")
    if not expected:  # an unknown key lists the accepted ones
        assert e.value.accepted == tuple(sorted(hosted.get(name).spec_keys))


def test_validation_is_the_partitioner_registrys(hosted: QuantizerRegistry) -> None:
    """Same messages as a partitioner's, for the same kind of mistake."""
    from remote_partitioner.server.registry import builtin_partitioners

    partitioner = {p.name: p for p in builtin_partitioners()}["xnnpack"]
    cases = [({"nope": 1}, {"nope": 1}), ({"per_op_mode": 1}, {"is_qat": 1})]
    for spec_p, spec_q in cases:
        with pytest.raises(InvalidSpecError) as ep:
            partitioner.create(spec_p)
        with pytest.raises(InvalidSpecError) as eq:
            hosted.build("xnnpack", spec_q)
        got_p = str(ep.value).split("; accepted keys:")[0].replace("per_op_mode", "KEY")
        got_q = str(eq.value).split("; accepted keys:")[0].replace("is_qat", "KEY")
        assert got_p == got_q
    assert hosted.get("xnnpack").validate({"is_qat": True, "act_qmin": -5}) == {
        "is_qat": True, "act_qmin": -5}


def test_unknown_quantizer_lists_the_hosted_names(hosted: QuantizerRegistry) -> None:
    with pytest.raises(UnknownQuantizerError) as e:
        hosted.get("qnn")
    assert issubclass(UnknownQuantizerError, KeyError)
    assert (e.value.name, e.value.hosted) == ("qnn", ("coreml", "vulkan", "xnnpack"))
    assert str(e.value) == "this server hosts no quantizer 'qnn'; hosted: coreml, vulkan, xnnpack"
    with pytest.raises(UnknownQuantizerError):
        hosted.build("qnn", {})
    assert str(UnknownQuantizerError("x", [])) == (
        "this server hosts no quantizer 'x'; hosted: (none)")


def _toy(name: str = "toy") -> HostedQuantizer:
    return HostedQuantizer(
        name, "ToyBackend", key_table(SpecKey("flag", bool, False, "a flag")),
        lambda spec: xnnpack_quantizer.XNNPACKQuantizer(), xnnpack_quantizer.XNNPACKQuantizer,
    )


def test_registry_and_hosted_quantizer_contracts() -> None:
    registry = QuantizerRegistry([_toy()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(_toy())
    with pytest.raises(TypeError, match="not a torchao Quantizer subclass"):
        HostedQuantizer("bad", "X", {}, lambda spec: None, dict)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="registered as"):
        HostedQuantizer("bad", "X", {"other": SpecKey("flag", bool, False, "f")},
                        lambda spec: xnnpack_quantizer.XNNPACKQuantizer(),
                        xnnpack_quantizer.XNNPACKQuantizer)


def test_a_backend_that_fails_is_left_out_and_logging_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    (tmp_path / "rp_broken_backend.py").write_text(
        "import logging\nlogging.getLogger().setLevel(logging.DEBUG)\n"
        "def hosted_quantizer():\n    raise ImportError('no SDK here')\n")
    (tmp_path / "rp_no_quantizer_backend.py").write_text("def hosted():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from remote_partitioner.server import registry

    monkeypatch.setattr(registry, "BUILTIN_BACKENDS", (
        ("broken", "rp_broken_backend"), ("plain", "rp_no_quantizer_backend"),
        ("xnnpack", "remote_partitioner.server.backends.xnnpack")))
    root = logging.getLogger()
    level = root.level
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        got = builtin_quantizers()
    assert got.names() == ["xnnpack"]
    assert root.level == level  # the broken backend's import set it to DEBUG
    assert [r.getMessage() for r in caplog.records] == [
        "quantizer 'broken' not available: ImportError: no SDK here"]


def test_plugins_register_through_entry_points(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = """
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
        from remote_partitioner.server.quantizers import HostedQuantizer

        def make():
            return [HostedQuantizer("plugged", "PlugBackend", {}, lambda spec: XNNPACKQuantizer(),
                                    XNNPACKQuantizer),
                    HostedQuantizer("xnnpack", "Shadow", {}, lambda spec: XNNPACKQuantizer(),
                                    XNNPACKQuantizer)]
    """
    with plugin_distribution(tmp_path, "rp_quantizer_plugin", source,
                             "plugged = rp_quantizer_plugin:make", group=ENTRY_POINT_GROUP):
        with caplog.at_level(logging.WARNING, logger=quantizers.__name__):
            registry = default_quantizers()
        assert registry.names() == ["coreml", "plugged", "vulkan", "xnnpack"]
        assert registry.get("xnnpack").backend_id == "XnnpackBackend"
        assert "skipping plugin quantizer 'xnnpack': name already taken" in caplog.text
        assert default_quantizers(plugins=False).names() == ["coreml", "vulkan", "xnnpack"]


# --- the hosted quantizer quantizes as the local one does -------------------------------


class _ConvLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(x)))


def _quantized(
    make: Callable[[], Quantizer], model: Callable[[], torch.nn.Module],
    inputs: tuple[torch.Tensor, ...],
) -> tuple[str, dict[str, torch.Tensor], torch.Tensor]:
    """prepare_pt2e, calibrate, convert_pt2e (as ExecuTorch's tester's Quantize stage) from
    seed 3: the converted code, its state dict, and the generator after."""
    torch.manual_seed(3)
    captured = torch.export.export(model().eval(), inputs, strict=True).module()
    prepared = prepare_pt2e(captured, make())  # type: ignore[arg-type]
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    state = {k: v.clone() for k, v in converted.state_dict().items()}
    return converted.code, state, torch.get_rng_state()


def _assert_same_quantization(
    hosted: Callable[[], Quantizer], local: Callable[[], Quantizer],
    model: Callable[[], torch.nn.Module], inputs: tuple[torch.Tensor, ...],
) -> None:
    code, state, rng = _quantized(hosted, model, inputs)
    local_code, local_state, local_rng = _quantized(local, model, inputs)
    assert code == local_code
    assert "quantize_per" in code
    assert state.keys() == local_state.keys()
    assert all(torch.equal(state[k], local_state[k]) for k in state)
    assert torch.equal(rng, local_rng)


_XNN_CASES = {
    "static per channel": {"is_per_channel": True},
    "dynamic per channel": {"is_per_channel": True, "is_dynamic": True},
    "static per tensor": {},
}


@pytest.mark.parametrize("case", list(_XNN_CASES))
def test_xnnpack_quantizes_as_the_local_quantizer(hosted: QuantizerRegistry, case: str) -> None:
    spec = _XNN_CASES[case]
    inputs = (torch.randn(1, 3, 8, 8),)

    def local() -> Quantizer:
        return xnnpack_quantizer.XNNPACKQuantizer().set_global(
            xnnpack_quantizer.get_symmetric_quantization_config(**spec))

    _assert_same_quantization(lambda: hosted.build("xnnpack", spec), local, _ConvLinear, inputs)


def test_vulkan_quantizes_as_the_local_quantizer(hosted: QuantizerRegistry) -> None:
    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def local() -> Quantizer:
        return vulkan_quantizer.VulkanQuantizer().set_global(
            vulkan_quantizer.get_symmetric_quantization_config())

    _assert_same_quantization(lambda: hosted.build("vulkan", {}), local, model,
                              (torch.randn(2, 8),))
