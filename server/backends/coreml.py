"""The hosted ``coreml`` partitioner and quantizer: ExecuTorch's ``CoreMLPartitioner`` (its spec
keys, and the compile specs they become) and ``CoreMLQuantizer``."""

from __future__ import annotations

import functools
import importlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    InvalidSpecError,
    SpecKey,
    SpecValue,
    constructor_arguments,
    enum_key,
    key_table,
    list_key,
    member,
    split_list,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

    from remote_partitioner.server.backend_registry import HostedBackend
    from remote_partitioner.server.quantizers import HostedQuantizer

#: coremltools' progress bars, drawn on stderr by every conversion: (module, name of tqdm).
_PROGRESS_BARS = (
    ("coremltools.converters.mil.frontend.torch.ops", "_tqdm"),
    ("coremltools.converters.mil.mil.passes.pass_pipeline", "tqdm"),
)

_COREML_COMPILE_KEYS = (
    "compute_unit",
    "minimum_deployment_target",
    "compute_precision",
    "model_type",
    "op_linear_quantizer_config",
    "pass_names",
)


def _quantizer_config(value: str) -> dict[str, Any]:
    """Parses a JSON object that coremltools accepts as an OpLinearQuantizerConfig."""
    import coremltools.optimize as cto

    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    try:
        # What CoreMLBackend.preprocess will do with it; fail here rather than there.
        cto.coreml.OpLinearQuantizerConfig._from_dict(parsed)
    except Exception as e:
        causes = "; ".join(str(c) for c in getattr(e, "exceptions", [e]))
        raise ValueError(f"not a valid OpLinearQuantizerConfig: {causes}") from None
    return parsed


def _logged_bar(bar: Any, logger: logging.Logger, *args: Any, **kwargs: Any) -> Any:
    from remote_partitioner.server.observability import ProgressLog

    return bar(*args, **{**kwargs, "file": ProgressLog(logger), "position": 0})


def _log_progress_bars() -> None:
    """Make coremltools' progress bars log instead of drawing on stderr: one INFO line of the
    ``coremltools`` logger per finished bar (:class:`~remote_partitioner.server.observability.
    ProgressLog`). Patches the modules of :data:`_PROGRESS_BARS` that still hold tqdm itself
    (so calling it again changes nothing)."""
    from tqdm import tqdm

    logger = logging.getLogger("coremltools")
    for module_name, name in _PROGRESS_BARS:
        try:  # coremltools' own modules: a release that moves them keeps its bars
            module = importlib.import_module(module_name)
        except ImportError:
            logger.debug("no %s: its progress bars are left as they are", module_name)
            continue
        if getattr(module, name, None) is tqdm:
            setattr(module, name, functools.partial(_logged_bar, tqdm, logger))


def hosted() -> HostedPartitioner:
    """The hosted ``coreml`` partitioner (imports coremltools and ExecuTorch's Core ML
    backend; raises if they cannot be imported). coremltools' progress bars then log
    (:func:`_log_progress_bars`)."""
    import coremltools as ct
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.compiler.coreml_preprocess import (
        MULTIMETHOD_WEIGHT_SHARING_STRATEGY,
    )
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    _log_progress_bars()

    keys = key_table(
        enum_key(
            "compute_unit", ct.ComputeUnit.__members__, "ALL", "coremltools.ComputeUnit member"
        ),
        enum_key(
            "minimum_deployment_target",
            ct.target.__members__,
            None,
            "coremltools.target member, e.g. iOS17 or macOS14; default coremltools' own",
        ),
        enum_key(
            "compute_precision",
            ct.precision.__members__,
            "FLOAT16",
            "coremltools.precision member",
        ),
        enum_key(
            "model_type",
            CoreMLBackend.MODEL_TYPE.__members__,
            "MODEL",
            "MODEL (mlpackage) or COMPILED_MODEL (mlmodelc)",
        ),
        SpecKey(
            "op_linear_quantizer_config",
            str,
            None,
            "JSON object for coremltools OpLinearQuantizerConfig (post-conversion quantization)",
            parse=_quantizer_config,
        ),
        SpecKey(
            "pass_names",
            str,
            None,
            "comma-separated coremltools passes (e.g. common::const_elimination) to run "
            "instead of the DEFAULT pipeline",
            tuple(sorted(PASS_REGISTRY.passes)),
            lambda v: [member({p: p for p in PASS_REGISTRY.passes}, i) for i in split_list(v)],
        ),
        enum_key(
            "multimethod_weight_sharing_strategy",
            MULTIMETHOD_WEIGHT_SHARING_STRATEGY.__members__,
            "POSITIONAL",
            "weight sharing across methods: POSITIONAL or DISABLED",
        ),
        list_key(
            "skip_ops_for_coreml_delegation",
            "comma-separated op names kept out of CoreML, lower case, e.g. aten.mm.default",
        ),
        SpecKey("take_over_mutable_buffer", bool, True, "delegate mutable buffers as CoreML state"),
        SpecKey("lower_full_graph", bool, False, "require the whole graph to be delegated"),
        SpecKey("take_over_constant_data", bool, True, "delegate constant data (weights)"),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        args = constructor_arguments(keys, spec)
        compile_args = {k: args.pop(k) for k in _COREML_COMPILE_KEYS if k in args}
        strategy = args.pop("multimethod_weight_sharing_strategy", None)
        if compile_args or strategy is not None:
            specs = CoreMLBackend.generate_compile_specs(**compile_args)
            if strategy is not None:
                specs.append(
                    CoreMLBackend.generate_multimethod_weight_sharing_strategy_compile_spec(
                        strategy
                    )
                )
            args["compile_specs"] = specs
        if args.get("lower_full_graph"):
            # The constructor asserts these (a bare AssertionError): name the key instead.
            conflicts = {
                "skip_ops_for_coreml_delegation": bool(args.get("skip_ops_for_coreml_delegation")),
                "take_over_constant_data": args.get("take_over_constant_data") is False,
                "take_over_mutable_buffer": args.get("take_over_mutable_buffer") is False,
            }
            for key, conflict in conflicts.items():
                if conflict:
                    raise InvalidSpecError(
                        key,
                        keys[key].type.__name__,
                        f"coreml: spec key {key!r} conflicts with lower_full_graph=True",
                    )
        return CoreMLPartitioner(**args)

    return HostedPartitioner(
        "coreml",
        "CoreMLBackend",
        keys,
        factory,
        CoreMLPartitioner,
        "Core ML: Apple CPU, GPU and Neural Engine through coremltools",
    )


#: The ``ModuleLinearQuantizerConfig`` ExecuTorch's own Core ML tester quantizes with
#: (``executorch/backends/apple/coreml/test/tester.py``, ``_get_static_int8_linear_qconfig``),
#: as spec values; the hosted quantizer's base configuration.
_TESTER_QUANTIZER_CONFIG: dict[str, SpecValue] = {
    "quantization_scheme": "symmetric",
    "activation_dtype": "quint8",
    "weight_dtype": "qint8",
    "weight_per_channel": True,
}


def hosted_quantizer() -> HostedQuantizer:
    """The hosted ``coreml`` quantizer (imports coremltools and ExecuTorch's Core ML quantizer;
    raises if they cannot be imported): ``CoreMLQuantizer(LinearQuantizerConfig(global_config=
    ModuleLinearQuantizerConfig(...)))``, a fresh quantizer per call.

    The spec keys are the ``ModuleLinearQuantizerConfig`` fields the PT2E ``CoreMLQuantizer``
    reads (not ``algorithm`` nor ``milestones``, which only coremltools' own
    ``LinearQuantizer`` reads). Unlike the registry's usual contract, an absent key is not
    left to coremltools: the base configuration is the one ExecuTorch's Core ML tester
    quantizes with (:data:`_TESTER_QUANTIZER_CONFIG`: symmetric, quint8 activations, qint8
    weights, per channel; coremltools 9.0's defaults are the same), and the client's keys
    replace its entries; an observer key absent is left to coremltools
    (``moving_average_min_max``). Dtypes travel as names (``quint8``, ``qint8``,
    ``float32``; ``float32`` leaves the activations, or the whole op, unquantized) and
    become torch dtypes.
    """
    import torch
    from coremltools.optimize.torch.quantization import (
        LinearQuantizerConfig,
        ModuleLinearQuantizerConfig,
    )
    from executorch.backends.apple.coreml.quantizer import CoreMLQuantizer

    from remote_partitioner.server.quantizers import HostedQuantizer

    schemes = {"symmetric": "symmetric", "affine": "affine"}
    # The observers the PT2E quantizer has (``_annotation_config._get_observer``).
    observers = {"moving_average_min_max": "moving_average_min_max", "min_max": "min_max"}
    keys = key_table(
        enum_key(
            "quantization_scheme",
            schemes,
            "symmetric",
            "symmetric (zero point 0, or 128 for unsigned activations) or affine",
        ),
        enum_key(
            "activation_dtype",
            {"quint8": torch.quint8, "float32": torch.float32},
            "quint8",
            "quint8, or float32: activations not quantized",
        ),
        enum_key(
            "weight_dtype",
            {"qint8": torch.qint8, "quint8": torch.quint8, "float32": torch.float32},
            "qint8",
            "qint8 or quint8, or float32: the op not quantized",
        ),
        SpecKey("weight_per_channel", bool, True, "weights per output channel, not per tensor"),
        enum_key(
            "weight_observer",
            observers,
            "moving_average_min_max",
            "weight observer: moving_average_min_max or min_max",
        ),
        enum_key(
            "activation_observer",
            observers,
            "moving_average_min_max",
            "activation observer: moving_average_min_max or min_max",
        ),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Quantizer:
        args = constructor_arguments(keys, {**_TESTER_QUANTIZER_CONFIG, **spec})
        config = LinearQuantizerConfig(global_config=ModuleLinearQuantizerConfig(**args))
        return CoreMLQuantizer(config)

    return HostedQuantizer(
        "coreml",
        "CoreMLBackend",
        keys,
        factory,
        CoreMLQuantizer,
        "Core ML: int8 PT2E quantization (coremltools' linear quantizer config, global)",
    )


def hosted_backends() -> list[HostedBackend]:
    """The backend whose ``preprocess`` the server runs for ``coreml`` (the ``Preprocess`` RPC):
    ExecuTorch's ``CoreMLBackend``, from
    coremltools' fresh conversion state each time (:func:`coremltools_fresh_state`)."""
    from executorch.backends.apple.coreml.compiler import CoreMLBackend

    from remote_partitioner.server.backend_registry import HostedBackend

    return [
        HostedBackend(
            CoreMLBackend,
            "ExecuTorch's CoreMLBackend (coremltools' conversion)",
            coremltools_fresh_state,
        )
    ]


def coremltools_fresh_state() -> None:
    """coremltools' conversion state as a fresh process has it.

    coremltools names the MIL operations it builds from process-wide counters
    (``Builder.name_count``: ``const_0``, ``const_1``, ...) and resets them after a conversion
    that succeeds, not after one that raises. Measured (ExecuTorch's suite,
    ``test_avgpool3d_combinations``): after a conversion that raised ("pool3D with ceil
    mode=True and include_pad=True not supported"), the next program is written with its
    constants named from ``const_8`` instead of ``const_0``, so its ``.pte`` differs from the
    one a fresh process writes. This is coremltools' own reset, run before the conversion.
    """
    from coremltools.converters.mil import converter

    converter._reset_conversion_state()
