"""Tests for remote_partitioner.server.registry, against the real installed partitioners."""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import coremltools as ct
import pytest
from executorch.backends.apple.coreml.compiler import CoreMLBackend
from executorch.backends.apple.coreml.compiler.coreml_preprocess import (
    MULTIMETHOD_WEIGHT_SHARING_STRATEGY,
)
from executorch.backends.apple.coreml.partition import CoreMLPartitioner
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.backends.vulkan.serialization.vulkan_graph_schema import (
    VkMemoryLayout,
    VkStorageType,
)
from executorch.backends.vulkan.vulkan_preprocess import parse_compile_spec
from executorch.backends.webgpu.partitioner import WebGPUPartitioner
from executorch.backends.xnnpack.partition import xnnpack_partitioner
from executorch.backends.xnnpack.partition.config.gemm_configs import (
    ConvolutionConfig,
    LinearConfig,
)
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export import ExportedProgram

from remote_partitioner.server import registry
from remote_partitioner.server.registry import (
    ENTRY_POINT_GROUP,
    HOOKS,
    HostedPartitioner,
    InvalidSpecError,
    Registry,
    SpecKey,
    SpecValue,
    UnknownPartitionerError,
    builtin_partitioners,
    default_registry,
    load_entry_points,
)

# --- a plugin, loaded through entry points by the tests below ------------------


class EchoPartitioner(Partitioner):
    """Delegates nothing; overrides every hook."""

    def __init__(self, threshold: float = 0.5, blob: bytes = b"") -> None:
        super().__init__({"threshold": threshold, "blob": blob})
        self.threshold = threshold
        self.blob = blob

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        return PartitionResult(tagged_exported_program=exported_program, partition_tags={})

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[Any], None]:
        return ([], None)

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        return exported_program


class TransformOnlyPartitioner(Partitioner):
    """Overrides only the pre-decomposition hook (abstract: never instantiated)."""

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        return exported_program


class ReexportingPartitioner(EchoPartitioner):
    """Puts the base class's own functions back: not overridden."""

    ops_to_not_decompose = Partitioner.ops_to_not_decompose
    transform_for_pre_decomposition = Partitioner.transform_for_pre_decomposition


def _echo(name: str) -> HostedPartitioner:
    return HostedPartitioner(
        name=name,
        backend_id="EchoBackend",
        spec_keys={
            "threshold": SpecKey("threshold", float, 0.5, "a float"),
            "blob": SpecKey("blob", bytes, b"", "some bytes"),
        },
        factory=lambda spec: EchoPartitioner(**spec),
        partitioner_class=EchoPartitioner,
        description="test plugin",
    )


PLUGIN = _echo("echo")


def plugin_list() -> list[HostedPartitioner]:
    return [_echo("echo_a"), _echo("echo_b")]


def broken_plugin() -> HostedPartitioner:
    raise RuntimeError("plugin exploded")


def duplicate_plugin() -> HostedPartitioner:
    return _echo("xnnpack")


NOT_A_PLUGIN = 42


@pytest.fixture
def plugin_dist(tmp_path: Path) -> Iterator[Path]:
    """Puts an installed-looking distribution declaring entry points on sys.path."""
    dist_info = tmp_path / "remote_partitioner_test_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: remote-partitioner-test-plugin\nVersion: 1.0\n"
    )
    module = __name__
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        f"echo = {module}:PLUGIN\n"
        f"echo_list = {module}:plugin_list\n"
        f"broken = {module}:broken_plugin\n"
        f"not_a_plugin = {module}:NOT_A_PLUGIN\n"
        f"duplicate = {module}:duplicate_plugin\n"
        "missing = remote_partitioner_no_such_module:thing\n"
    )
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        importlib.invalidate_caches()


# --- helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hosted() -> dict[str, HostedPartitioner]:
    return {h.name: h for h in builtin_partitioners()}


@pytest.fixture(autouse=True)
def _keep_xnnpack_logger_level() -> Iterator[None]:
    # verbose=True sets this logger to DEBUG for the whole process.
    logger = logging.getLogger(xnnpack_partitioner.__name__)
    level = logger.level
    yield
    logger.setLevel(level)


def _state(obj: object) -> object:
    """A comparable snapshot of a partitioner's configuration, recursing into the
    backend objects it holds (XNNPACK partitioner configs)."""
    if isinstance(obj, (Enum, type)):
        return obj
    if isinstance(obj, Mapping):
        return {k: _state(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return frozenset(obj)
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_state(v) for v in obj])
    if isinstance(obj, Partitioner) or type(obj).__module__.startswith("executorch.backends."):
        return (type(obj).__qualname__, _state(vars(obj)))
    return obj


def _expected_hooks(cls: type) -> tuple[str, ...]:
    """Which hooks a class overrides: the owner found along the MRO is not Partitioner."""
    owners = {hook: next(k for k in cls.__mro__ if hook in k.__dict__) for hook in HOOKS}
    return tuple(hook for hook in HOOKS if owners[hook] is not Partitioner)


# --- built-ins -----------------------------------------------------------------


def test_a_family_whose_toolchain_is_missing_is_left_out_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The main environment has no tosa-tools: the Arm family is not hosted, and says so at
    # INFO (a warning on every start of a server built for other backends would be noise).
    with caplog.at_level(logging.DEBUG, logger=registry.__name__):
        names = [h.name for h in builtin_partitioners()]
    assert "arm_tosa" not in names and "ethos_u55" not in names
    ((record,),) = [[r for r in caplog.records if "'arm'" in r.getMessage()]]
    assert record.levelno == logging.INFO
    # (The first of the toolchain's modules found missing: tosa-tools' or Vela's.)
    assert re.fullmatch(
        r"partitioner 'arm' not hosted: (tosa_serializer|ethosu) is not installed here",
        record.getMessage(),
    )
    # Anything else that breaks a family is a warning.
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=registry.__name__):
        registry.log_unavailable("partitioner", "x", ImportError("libfoo.so: cannot open"))
        registry.log_unavailable(
            "partitioner", "y", ModuleNotFoundError("gone", name="remote_partitioner.gone"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "partitioner 'x' not available: ImportError: libfoo.so: cannot open"),
        (logging.WARNING, "partitioner 'y' not available: ModuleNotFoundError: gone"),
    ]


def test_only_the_named_families_are_hosted() -> None:
    assert [h.name for h in builtin_partitioners(["vulkan", "xnnpack"])] == ["xnnpack", "vulkan"]
    assert default_registry(plugins=False, only=["coreml"]).names() == ["coreml"]
    with pytest.raises(ValueError, match=r"no built-in backend family 'tosa'; built in: "
                       r"xnnpack, coreml, vulkan, webgpu, arm, openvino$"):
        builtin_partitioners(["tosa"])
    registry.check_family("xnnpack")
    with pytest.raises(ModuleNotFoundError, match=r"tosa_serializer|ethosu"):
        registry.check_family("arm")


def test_builtins_all_import_here(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        builtins = builtin_partitioners()
    assert [h.name for h in builtins] == ["xnnpack", "coreml", "vulkan", "webgpu"]
    assert [r for r in caplog.records if r.name == registry.__name__] == []
    assert {h.name: (h.backend_id, h.partitioner_class) for h in builtins} == {
        "xnnpack": ("XnnpackBackend", XnnpackPartitioner),
        "coreml": ("CoreMLBackend", CoreMLPartitioner),
        "vulkan": ("VulkanBackend", VulkanPartitioner),
        "webgpu": ("VulkanBackend", WebGPUPartitioner),
    }
    for h in builtins:
        built = h.create({})
        assert type(built) is h.partitioner_class
        # (WebGPU's partitions with the Vulkan partitioner it holds)
        spec = getattr(built, "delegation_spec", None) or built._vulkan_partitioner.delegation_spec
        assert spec.backend_id == h.backend_id
        assert h.description
        for key in h.spec_keys.values():
            assert key.doc and "\n" not in key.doc


@pytest.mark.parametrize(
    "name, no_arg",
    [("xnnpack", XnnpackPartitioner), ("coreml", CoreMLPartitioner), ("vulkan", VulkanPartitioner)],
)
def test_empty_spec_builds_the_no_argument_partitioner(
    hosted: dict[str, HostedPartitioner], name: str, no_arg: Callable[[], Partitioner]
) -> None:
    built = hosted[name].create({})
    local = no_arg()
    assert _state(built) == _state(local)
    assert built.delegation_spec == local.delegation_spec


def test_overridden_hooks_of_builtins(hosted: dict[str, HostedPartitioner]) -> None:
    for h in hosted.values():
        assert h.overridden_hooks() == _expected_hooks(h.partitioner_class)
    # Verified in the 1.5.1 sources: each defines partition itself; XNNPACK inherits
    # ops_to_not_decompose from ConfigerationBasedPartitioner; nobody overrides
    # transform_for_pre_decomposition.
    for name in ("xnnpack", "coreml", "vulkan", "webgpu"):
        assert hosted[name].overridden_hooks() == ("partition", "ops_to_not_decompose")


def test_overridden_hooks_compares_functions_along_the_mro() -> None:
    def hooks(cls: type) -> tuple[str, ...]:
        return HostedPartitioner("t", "T", {}, EchoPartitioner, cls).overridden_hooks()

    assert hooks(EchoPartitioner) == HOOKS == _expected_hooks(EchoPartitioner)
    assert hooks(TransformOnlyPartitioner) == ("transform_for_pre_decomposition",)
    assert hooks(TransformOnlyPartitioner) == _expected_hooks(TransformOnlyPartitioner)
    assert hooks(ReexportingPartitioner) == ("partition",)


# --- every spec key, against the local constructor -----------------------------

_QUANT_CONFIG = {"mode": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"}
_PASSES = ["common::dead_code_elimination", "common::const_elimination"]


def _coreml_specs(p: Partitioner) -> list[Any]:
    return p.delegation_spec.compile_specs


def _vulkan_options(p: Partitioner) -> dict[str, Any]:
    """What VulkanBackend.preprocess will read from the compile specs."""
    return parse_compile_spec(p.delegation_spec.compile_specs)


def _xnn_configs(p: Partitioner) -> list[Any]:
    return list(p.target_partitioner_configs.values())


def _debug_logging(p: Partitioner) -> bool:
    return logging.getLogger(xnnpack_partitioner.__name__).level == logging.DEBUG


# (partitioner, spec, local equivalent, extra check of the observable effect)
CASES: list[
    tuple[str, dict[str, SpecValue], Callable[[], Partitioner], Callable[[Partitioner], bool]]
] = [
    (
        "xnnpack",
        {"configs": "LinearConfig, convolutionconfig"},
        lambda: XnnpackPartitioner(configs=[LinearConfig, ConvolutionConfig]),
        lambda p: set(p.target_partitioner_configs) == {"linear.default", "convolution.default"},
    ),
    (
        "xnnpack",
        {"config_precisions": "DYNAMIC_QUANT"},
        lambda: XnnpackPartitioner(config_precisions=[ConfigPrecisionType.DYNAMIC_QUANT]),
        lambda p: all(
            c.enabled_precision_types
            == [t for t in c.supported_precision_types() if t is ConfigPrecisionType.DYNAMIC_QUANT]
            for c in _xnn_configs(p)
        ),
    ),
    (
        "xnnpack",
        {"config_precisions": "fp32,static_quant"},
        lambda: XnnpackPartitioner(
            config_precisions=[ConfigPrecisionType.FP32, ConfigPrecisionType.STATIC_QUANT]
        ),
        lambda p: all(
            ConfigPrecisionType.DYNAMIC_QUANT not in c.enabled_precision_types
            for c in _xnn_configs(p)
        ),
    ),
    (
        "xnnpack",
        {"per_op_mode": True},
        lambda: XnnpackPartitioner(per_op_mode=True),
        lambda p: p.per_op_mode,
    ),
    ("xnnpack", {"verbose": True}, lambda: XnnpackPartitioner(verbose=True), _debug_logging),
    (
        "xnnpack",
        {"force_non_static_weights_for_f32_linear": True},
        lambda: XnnpackPartitioner(force_non_static_weights_for_f32_linear=True),
        lambda p: all(c.force_non_static_weights_for_f32_linear for c in _xnn_configs(p)),
    ),
    (
        "xnnpack",
        {"enable_bf16": True},
        lambda: XnnpackPartitioner(enable_bf16=True),
        lambda p: all(c.enable_bf16 for c in _xnn_configs(p)),
    ),
    (
        "coreml",
        {"compute_unit": "cpu_and_ne"},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                compute_unit=ct.ComputeUnit.CPU_AND_NE
            )
        ),
        lambda p: (
            CoreMLBackend.compute_unit_from_compile_specs(_coreml_specs(p))
            is ct.ComputeUnit.CPU_AND_NE
        ),
    ),
    (
        "coreml",
        {"minimum_deployment_target": "macos14"},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                minimum_deployment_target=ct.target.macOS14
            )
        ),
        lambda p: (
            CoreMLBackend.min_deployment_target_from_compile_specs(_coreml_specs(p))
            == ct.target.iOS17
        ),
    ),
    (
        "coreml",
        {"compute_precision": "Float32"},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                compute_precision=ct.precision.FLOAT32
            )
        ),
        lambda p: (
            CoreMLBackend.model_compute_precision_from_compile_specs(_coreml_specs(p))
            is ct.precision.FLOAT32
        ),
    ),
    (
        "coreml",
        {"model_type": "compiled_model"},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                model_type=CoreMLBackend.MODEL_TYPE.COMPILED_MODEL
            )
        ),
        lambda p: (
            CoreMLBackend.model_type_from_compile_specs(_coreml_specs(p))
            is CoreMLBackend.MODEL_TYPE.COMPILED_MODEL
        ),
    ),
    (
        "coreml",
        {"op_linear_quantizer_config": json.dumps(_QUANT_CONFIG)},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                op_linear_quantizer_config=_QUANT_CONFIG
            )
        ),
        lambda p: (
            CoreMLBackend.op_linear_quantizer_config_from_compile_specs(_coreml_specs(p)).mode
            == "LINEAR_SYMMETRIC"
        ),
    ),
    (
        "coreml",
        {"pass_names": ", ".join(_PASSES)},
        lambda: CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(pass_names=_PASSES)
        ),
        lambda p: (
            CoreMLBackend.pass_pipeline_from_compile_specs(_coreml_specs(p)).passes == _PASSES
        ),
    ),
    (
        "coreml",
        {"multimethod_weight_sharing_strategy": "disabled"},
        lambda: CoreMLPartitioner(
            compile_specs=[
                *CoreMLBackend.generate_compile_specs(),
                CoreMLBackend.generate_multimethod_weight_sharing_strategy_compile_spec(
                    MULTIMETHOD_WEIGHT_SHARING_STRATEGY.DISABLED
                ),
            ]
        ),
        lambda p: (
            CoreMLBackend.multimethod_weight_sharing_strategy_from_compile_specs(_coreml_specs(p))
            is MULTIMETHOD_WEIGHT_SHARING_STRATEGY.DISABLED
        ),
    ),
    (
        "coreml",
        {"skip_ops_for_coreml_delegation": "aten.mm.default, aten.convolution.default"},
        lambda: CoreMLPartitioner(
            skip_ops_for_coreml_delegation=["aten.mm.default", "aten.convolution.default"]
        ),
        lambda p: (
            p.skip_ops_for_coreml_delegation == ["aten.mm.default", "aten.convolution.default"]
        ),
    ),
    (
        "coreml",
        {"take_over_mutable_buffer": False},
        lambda: CoreMLPartitioner(take_over_mutable_buffer=False),
        lambda p: p.take_over_mutable_buffer is False,
    ),
    (
        "coreml",
        {"lower_full_graph": True},
        lambda: CoreMLPartitioner(lower_full_graph=True),
        lambda p: p.lower_full_graph is True,
    ),
    (
        "coreml",
        {"take_over_constant_data": False},
        lambda: CoreMLPartitioner(take_over_constant_data=False),
        lambda p: p.take_over_constant_data is False,
    ),
    (
        "vulkan",
        {"texture_limits": "4096, 4096, 1024"},
        lambda: VulkanPartitioner(compile_options={"texture_limits": (4096, 4096, 1024)}),
        lambda p: [_vulkan_options(p)[f"texture_limits_{a}"] for a in "xyz"] == [4096, 4096, 1024],
    ),
    (
        "vulkan",
        {"small_texture_limits": True},
        lambda: VulkanPartitioner(compile_options={"small_texture_limits": True}),
        lambda p: _vulkan_options(p)["small_texture_limits"] is True,
    ),
    (
        "vulkan",
        {"buffer_limit": 1024},
        lambda: VulkanPartitioner(compile_options={"buffer_limit": 1024}),
        # Read by the partitioner only: not a compile spec.
        lambda p: p.options == {"buffer_limit": 1024} and _coreml_specs(p) == [],
    ),
    (
        "vulkan",
        {"require_dynamic_shapes": True},
        lambda: VulkanPartitioner(compile_options={"require_dynamic_shapes": True}),
        lambda p: p.options["require_dynamic_shapes"] is True,
    ),
    (
        "vulkan",
        {"skip_bool_tensors": True},
        lambda: VulkanPartitioner(compile_options={"skip_bool_tensors": True}),
        lambda p: p.options["skip_bool_tensors"] is True,
    ),
    (
        "vulkan",
        {"storage_type_override": "buffer"},
        lambda: VulkanPartitioner(compile_options={"storage_type_override": VkStorageType.BUFFER}),
        lambda p: _vulkan_options(p)["storage_type_override"] is VkStorageType.BUFFER,
    ),
    (
        "vulkan",
        {"memory_layout_override": "TENSOR_CHANNELS_PACKED"},
        lambda: VulkanPartitioner(
            compile_options={"memory_layout_override": VkMemoryLayout.TENSOR_CHANNELS_PACKED}
        ),
        lambda p: (
            _vulkan_options(p)["memory_layout_override"] is VkMemoryLayout.TENSOR_CHANNELS_PACKED
        ),
    ),
    *[
        (
            "vulkan",
            {flag: value},
            # bind loop variables now
            (lambda flag=flag, value=value: VulkanPartitioner(compile_options={flag: value})),
            (lambda p, flag=flag, value=value: _vulkan_options(p)[flag] is value),
        )
        for flag, value in [
            ("skip_tag_memory_metadata", True),
            ("downcast_64_bit", False),
            ("force_fp16", True),
            ("skip_memory_planning", True),
            ("alias_buffer_mutations", True),
        ]
    ],
    (
        "vulkan",
        {"external_constants_max_data_bytes": 1 << 20},
        lambda: VulkanPartitioner(compile_options={"external_constants_max_data_bytes": 1 << 20}),
        lambda p: _vulkan_options(p)["external_constants_max_data_bytes"] == 1 << 20,
    ),
    (
        "vulkan",
        {"operator_blocklist": "aten.add.Tensor, aten.relu, llama::custom_sdpa"},
        lambda: VulkanPartitioner(
            operator_blocklist=[
                exir_ops.edge.aten.add.Tensor,
                exir_ops.edge.aten.relu.default,
                "llama::custom_sdpa",
            ]
        ),
        lambda p: exir_ops.edge.aten.relu.default in p.operator_blocklist,
    ),
    (
        "vulkan",
        {"operator_allowlist": "aten.mm.default"},
        lambda: VulkanPartitioner(operator_allowlist=[exir_ops.edge.aten.mm.default]),
        lambda p: p.operator_allowlist == {exir_ops.edge.aten.mm.default},
    ),
    (
        "vulkan",
        {"nn_module_blocklist": "Linear,Conv2d"},
        lambda: VulkanPartitioner(nn_module_blocklist=["Linear", "Conv2d"]),
        lambda p: p.nn_module_blocklist == {"Linear", "Conv2d"},
    ),
    (
        "vulkan",
        {"nn_module_allowlist": "Attention"},
        lambda: VulkanPartitioner(nn_module_allowlist=["Attention"]),
        lambda p: p.nn_module_allowlist == {"Attention"},
    ),
    # WebGPU takes Vulkan's keys (one table, test_cases_cover_every_spec_key) into the Vulkan
    # partitioner it holds: the suite's flow restricts it to the WebGPU runtime's operators.
    (
        "webgpu",
        {"skip_bool_tensors": True, "operator_allowlist": "aten.add.Tensor,et_vk.rms_norm"},
        lambda: WebGPUPartitioner(
            {"skip_bool_tensors": True},
            operator_allowlist=[exir_ops.edge.aten.add.Tensor,
                                exir_ops.edge.et_vk.rms_norm.default],
        ),
        lambda p: p._vulkan_partitioner.operator_allowlist == {
            exir_ops.edge.aten.add.Tensor, exir_ops.edge.et_vk.rms_norm.default},
    ),
]


@pytest.mark.parametrize(
    "name, spec, local, effect", CASES, ids=[f"{c[0]}-{next(iter(c[1]))}" for c in CASES]
)
def test_spec_key_builds_what_the_constructor_builds(
    hosted: dict[str, HostedPartitioner],
    name: str,
    spec: dict[str, SpecValue],
    local: Callable[[], Partitioner],
    effect: Callable[[Partitioner], bool],
) -> None:
    built = hosted[name].create(spec)
    assert effect(built)
    assert _state(built) == _state(local())
    if spec != {"verbose": True}:  # verbose only changes the module's logger
        assert _state(built) != _state(hosted[name].create({}))


def test_cases_cover_every_spec_key(hosted: dict[str, HostedPartitioner]) -> None:
    covered: dict[str, set[str]] = {name: set() for name in hosted}
    for name, spec, _, _ in CASES:
        covered[name] |= set(spec)
    assert hosted["webgpu"].spec_keys == hosted["vulkan"].spec_keys  # one table: Vulkan's
    covered["webgpu"] = covered["vulkan"]
    assert covered == {name: set(h.spec_keys) for name, h in hosted.items()}


def test_several_keys_combine_in_one_call(hosted: dict[str, HostedPartitioner]) -> None:
    coreml = hosted["coreml"].create({"compute_precision": "float32", "compute_unit": "CPU_ONLY"})
    assert (
        coreml.delegation_spec
        == CoreMLPartitioner(
            compile_specs=CoreMLBackend.generate_compile_specs(
                compute_unit=ct.ComputeUnit.CPU_ONLY, compute_precision=ct.precision.FLOAT32
            )
        ).delegation_spec
    )
    # Vulkan compile specs follow the client's key order, as a local dict would.
    vulkan = hosted["vulkan"].create({"force_fp16": True, "downcast_64_bit": False})
    assert [s.key for s in vulkan.delegation_spec.compile_specs] == [
        "force_fp16",
        "downcast_64_bit",
    ]


def test_explicit_defaults_of_flags_build_the_default(hosted: dict[str, HostedPartitioner]) -> None:
    for name, h in hosted.items():
        flags = {k.name: k.default for k in h.spec_keys.values() if k.type is bool}
        if name in ("vulkan", "webgpu"):  # bool compile options always become compile specs
            continue
        assert _state(h.create(flags)) == _state(h.create({}))


# --- validation ----------------------------------------------------------------


def test_unknown_key_lists_accepted_keys(hosted: dict[str, HostedPartitioner]) -> None:
    for h in hosted.values():
        with pytest.raises(InvalidSpecError) as info:
            h.create({"bogus": True})
        assert info.value.key == "bogus"
        assert info.value.expected == ""
        assert info.value.accepted == tuple(sorted(h.spec_keys))
        assert "bogus" in str(info.value)
        assert ", ".join(sorted(h.spec_keys)) in str(info.value)
    with pytest.raises(
        InvalidSpecError, match="unknown spec key 3; accepted keys: config_precisions"
    ):
        hosted["xnnpack"].validate({3: True})


@pytest.mark.parametrize(
    "name, key, value, expected",
    [
        ("xnnpack", "per_op_mode", 1, "bool"),  # int is not bool
        ("coreml", "lower_full_graph", "yes", "bool"),
        ("vulkan", "buffer_limit", True, "int"),  # bool is not int
        ("vulkan", "buffer_limit", 1.0, "int"),
        ("vulkan", "external_constants_max_data_bytes", "1", "int"),
        ("xnnpack", "config_precisions", b"fp32", "str"),
        ("coreml", "compute_unit", None, "str"),
    ],
)
def test_wrong_type_names_key_and_expected_type(
    hosted: dict[str, HostedPartitioner], name: str, key: str, value: object, expected: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        hosted[name].create({key: value})
    assert (info.value.key, info.value.expected) == (key, expected)
    assert key in str(info.value) and expected in str(info.value)
    assert isinstance(info.value, ValueError)


def test_float_and_bytes_keys() -> None:
    echo = _echo("echo")
    assert echo.validate({"threshold": 3}) == {"threshold": 3.0}
    assert type(echo.validate({"threshold": 3})["threshold"]) is float
    built = echo.create({"threshold": 0.25, "blob": b"\x00"})
    assert isinstance(built, EchoPartitioner)
    assert (built.threshold, built.blob) == (0.25, b"\x00")
    for bad in ({"threshold": True}, {"threshold": "0.5"}, {"blob": "text"}):
        with pytest.raises(InvalidSpecError) as info:
            echo.validate(bad)
        assert info.value.expected == echo.spec_keys[info.value.key].type.__name__


@pytest.mark.parametrize(
    "name, spec, accepted",
    [
        ("coreml", {"compute_unit": "gpu"}, "CPU_AND_GPU"),
        ("coreml", {"minimum_deployment_target": "iOS12"}, "iOS13"),
        ("coreml", {"compute_precision": "bf16"}, "FLOAT16"),
        ("coreml", {"model_type": "mlpackage"}, "COMPILED_MODEL"),
        ("coreml", {"multimethod_weight_sharing_strategy": "shared"}, "POSITIONAL"),
        ("coreml", {"pass_names": "common::no_such_pass"}, "common::const_elimination"),
        ("coreml", {"op_linear_quantizer_config": "[1]"}, "JSON object"),
        ("coreml", {"op_linear_quantizer_config": "{"}, "not valid JSON"),
        ("coreml", {"op_linear_quantizer_config": '{"mode": "nope"}'}, "OpLinearQuantizerConfig"),
        ("xnnpack", {"config_precisions": "fp32,fp16"}, "STATIC_QUANT"),
        ("xnnpack", {"configs": "NoSuchConfig"}, "LinearConfig"),
        ("xnnpack", {"configs": "LinearConfig,linearconfig"}, "twice"),
        ("vulkan", {"storage_type_override": "texture"}, "TEXTURE_3D"),
        ("vulkan", {"memory_layout_override": "nchw"}, "TENSOR_WIDTH_PACKED"),
        ("vulkan", {"texture_limits": "1,2"}, "x,y,z"),
        ("vulkan", {"texture_limits": "1,0,2"}, "positive"),
        ("vulkan", {"external_constants_max_data_bytes": 0}, "1.."),
        ("vulkan", {"buffer_limit": -1}, "1.."),
        ("vulkan", {"operator_blocklist": "aten.no_such_op.default"}, "edge dialect operator"),
        ("vulkan", {"operator_allowlist": "add"}, "namespace.op.overload"),
    ],
)
def test_unparsable_value_names_key_and_accepted_values(
    hosted: dict[str, HostedPartitioner], name: str, spec: dict[str, SpecValue], accepted: str
) -> None:
    (key,) = spec
    with pytest.raises(InvalidSpecError) as info:
        hosted[name].validate(spec)
    assert info.value.key == key
    assert info.value.expected == hosted[name].spec_keys[key].type.__name__
    assert key in str(info.value) and accepted in str(info.value)
    assert info.value.accepted == hosted[name].spec_keys[key].choices


@pytest.mark.parametrize(
    "conflict",
    [
        {"skip_ops_for_coreml_delegation": "aten.mm.default"},
        {"take_over_constant_data": False},
        {"take_over_mutable_buffer": False},
    ],
)
def test_coreml_lower_full_graph_conflicts(
    hosted: dict[str, HostedPartitioner], conflict: dict[str, SpecValue]
) -> None:
    with pytest.raises(InvalidSpecError, match="lower_full_graph") as info:
        hosted["coreml"].create({"lower_full_graph": True, **conflict})
    assert info.value.key == next(iter(conflict))


def test_spec_key_and_hosted_partitioner_reject_bad_declarations() -> None:
    with pytest.raises(TypeError):
        SpecKey("x", list, None, "lists are not scalars")
    with pytest.raises(TypeError):
        SpecKey("x", int, True, "bool default for an int key")
    with pytest.raises(TypeError):
        HostedPartitioner("x", "X", {}, EchoPartitioner, object)
    with pytest.raises(ValueError):
        HostedPartitioner(
            "x", "X", {"a": SpecKey("b", int, None, "misfiled")}, EchoPartitioner, EchoPartitioner
        )


# --- registry ------------------------------------------------------------------


def test_registry_lookup_and_unknown_name(hosted: dict[str, HostedPartitioner]) -> None:
    reg = Registry(hosted.values())
    assert reg.names() == ["coreml", "vulkan", "webgpu", "xnnpack"]
    assert [h.name for h in reg] == reg.names()
    assert len(reg) == 4 and "vulkan" in reg and "foo" not in reg
    assert reg.get("coreml") is hosted["coreml"]
    assert isinstance(reg.create("xnnpack", {"per_op_mode": True}), XnnpackPartitioner)
    with pytest.raises(UnknownPartitionerError) as info:
        reg.get("foo")
    assert str(info.value) == "unknown partitioner 'foo'; hosted: coreml, vulkan, webgpu, xnnpack"
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownPartitionerError, match="hosted: coreml, vulkan, webgpu, xnnpack"):
        reg.create("foo", {})
    assert str(UnknownPartitionerError("foo", [])) == "unknown partitioner 'foo'; hosted: (none)"


def test_registry_rejects_duplicate_names(hosted: dict[str, HostedPartitioner]) -> None:
    reg = Registry([hosted["xnnpack"]])
    with pytest.raises(ValueError, match="xnnpack"):
        reg.register(_echo("xnnpack"))
    with pytest.raises(ValueError):
        Registry([_echo("a"), _echo("a")])
    reg.register(_echo("echo"))
    assert reg.names() == ["echo", "xnnpack"]


# --- plugins -------------------------------------------------------------------


def test_plugins_load_through_entry_points(
    plugin_dist: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        plugins = load_entry_points()
    names = sorted(p.name for p in plugins)
    assert names == ["echo", "echo_a", "echo_b", "xnnpack"]
    assert next(p for p in plugins if p.name == "echo") is PLUGIN
    skipped = "\n".join(r.getMessage() for r in caplog.records)
    for broken in ("broken", "not_a_plugin", "missing"):
        assert f"skipping partitioner plugin {broken} =" in skipped
    assert "plugin exploded" in skipped

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        reg = default_registry()
    assert reg.names() == ["coreml", "echo", "echo_a", "echo_b", "vulkan", "webgpu", "xnnpack"]
    assert reg.get("xnnpack").partitioner_class is XnnpackPartitioner  # builtin kept
    assert "'xnnpack': name already taken" in caplog.text
    built = reg.create("echo", {"threshold": 2})
    assert isinstance(built, EchoPartitioner) and built.threshold == 2.0

    assert default_registry(plugins=False).names() == ["coreml", "vulkan", "webgpu", "xnnpack"]
    assert load_entry_points("remote_partitioner.no_such_group") == []


def test_plugin_path_is_cleaned_up() -> None:
    assert not any(p.name == "echo" for p in load_entry_points())


def test_vela_options_are_an_allow_list_kept_in_order() -> None:
    """Ethos-U's ``extra_flags`` reach Vela's command line: only allow-listed options, none
    that names a file (``--output-dir``, ``--config``) or prints a report, each checked, in the
    client's order (part of the compile spec, hence of the .pte). Plain Python: checked here,
    where the Arm toolchain itself is not installed."""
    from remote_partitioner.server.backends.arm import parse_vela_flags

    assert parse_vela_flags("--arena-cache-size=2097152  --optimise=Size --disable-chaining") == [
        "--arena-cache-size=2097152", "--optimise=Size", "--disable-chaining"]
    for bad, message in [
        ("--output-dir=/tmp", "'--output-dir=/tmp' is not an accepted Vela option"),
        ("--config=/etc/passwd", "'--config=/etc/passwd' is not an accepted Vela option"),
        ("--verbose-all", "'--verbose-all' is not an accepted Vela option"),
        ("--optimise=Fast", "'--optimise=Fast': 'Fast' is not one of Size, Performance"),
        ("--arena-cache-size=-1", "'--arena-cache-size=-1': -1 is below 0"),
        ("--arena-cache-size", "--arena-cache-size takes a value"),
        ("--disable-chaining=1", "--disable-chaining takes no value"),
        ("--output-format=tflite", "'tflite' is not one of raw"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_vela_flags(bad)
