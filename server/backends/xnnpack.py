"""The hosted ``xnnpack`` partitioner and quantizer: ExecuTorch's ``XnnpackPartitioner`` and
``XNNPACKQuantizer``, and their spec keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    InvalidSpecError,
    SpecKey,
    SpecValue,
    constructor_arguments,
    enum_list_key,
    key_table,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

    from remote_partitioner.server.backend_registry import HostedBackend
    from remote_partitioner.server.quantizers import HostedQuantizer


def hosted() -> HostedPartitioner:
    """The hosted ``xnnpack`` partitioner (imports ExecuTorch's XNNPACK backend; raises if
    it cannot be imported)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.xnnpack_config import (
        ConfigPrecisionType,
    )
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    keys = key_table(
        enum_list_key(
            "configs",
            {c.__name__: c for c in ALL_PARTITIONER_CONFIGS},
            "comma-separated partitioner config classes to use (e.g. LinearConfig); default all",
        ),
        enum_list_key(
            "config_precisions",
            ConfigPrecisionType.__members__,
            "comma-separated precisions to partition (fp32, static_quant, dynamic_quant); "
            "default every precision each config supports",
        ),
        SpecKey("per_op_mode", bool, False, "one partition per matched op, no merging"),
        SpecKey(
            "verbose", bool, False, "set the XNNPACK partitioner logger to DEBUG (process-wide)"
        ),
        SpecKey(
            "force_non_static_weights_for_f32_linear",
            bool,
            False,
            "fp32 linear/addmm/mm: do not delegate the weight (dynamic weights)",
        ),
        SpecKey("enable_bf16", bool, False, "also delegate bfloat16 nodes"),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        return XnnpackPartitioner(**constructor_arguments(keys, spec))

    return HostedPartitioner(
        "xnnpack",
        "XnnpackBackend",
        keys,
        factory,
        XnnpackPartitioner,
        "XNNPACK: optimized CPU kernels (fp32, fp16, int8 static and dynamic quantization)",
    )


def _int8(value: int) -> int:
    if not -128 <= value <= 127:
        raise ValueError(f"{value} is not in the int8 range -128..127")
    return value


def hosted_quantizer() -> HostedQuantizer:
    """The hosted ``xnnpack`` quantizer (imports ExecuTorch's XNNPACK quantizer; raises if it
    cannot be imported): ``XNNPACKQuantizer().set_global(get_symmetric_quantization_config(
    **spec))``, a fresh quantizer per call, its spec keys the configuration function's
    arguments with its defaults.

    The configuration function is ``functools.lru_cache``d: a call's config object is shared
    by the calls with the same arguments (it is immutable; the observers are made per
    ``prepare_pt2e``). It is called with keyword arguments only, exactly the keys the client
    sent, in the function's parameter order (so a spec's key order does not make another
    cache entry); ``{}`` calls it without arguments, as ``get_symmetric_quantization_config()``.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    from remote_partitioner.server.quantizers import HostedQuantizer

    keys = key_table(
        SpecKey("is_per_channel", bool, False, "weights per output channel, not per tensor"),
        SpecKey("is_qat", bool, False, "fake-quantize config for quantization-aware training"),
        SpecKey("is_dynamic", bool, False, "dynamic: activations quantized at run time"),
        SpecKey("act_qmin", int, -128, "activation int8 quant_min", parse=_int8),
        SpecKey("act_qmax", int, 127, "activation int8 quant_max", parse=_int8),
        SpecKey("weight_qmin", int, -127, "weight int8 quant_min", parse=_int8),
        SpecKey("weight_qmax", int, 127, "weight int8 quant_max", parse=_int8),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Quantizer:
        args = constructor_arguments(keys, spec)
        _check_range(keys, args, "act_qmin", "act_qmax")
        _check_range(keys, args, "weight_qmin", "weight_qmax")
        config = get_symmetric_quantization_config(**{k: args[k] for k in keys if k in args})
        return XNNPACKQuantizer().set_global(config)

    return HostedQuantizer(
        "xnnpack",
        "XnnpackBackend",
        keys,
        factory,
        XNNPACKQuantizer,
        "XNNPACK: symmetric int8 PT2E quantization (static or dynamic, per channel or tensor)",
    )


def _check_range(
    keys: Mapping[str, SpecKey], args: Mapping[str, object], low: str, high: str
) -> None:
    """InvalidSpecError (naming the key the client sent) when ``low`` exceeds ``high``, each
    the client's value or the key's default (torchao would raise a ValueError later)."""
    lo, hi = args.get(low, keys[low].default), args.get(high, keys[high].default)
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        key = high if high in args else low
        raise InvalidSpecError(
            key, "int", f"xnnpack: spec key {key!r}: {low} {lo} exceeds {high} {hi}"
        )


def hosted_backends() -> list[HostedBackend]:
    """The backend whose ``preprocess`` the server runs for ``xnnpack`` (the ``Preprocess`` RPC):
    ExecuTorch's ``XnnpackBackend``."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from remote_partitioner.server.backend_registry import HostedBackend

    return [HostedBackend(XnnpackBackend, "ExecuTorch's XnnpackBackend (XNNPACK's preprocess)")]
