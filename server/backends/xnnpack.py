"""The hosted ``xnnpack`` partitioner: ExecuTorch's ``XnnpackPartitioner`` and its spec keys."""

from __future__ import annotations

from collections.abc import Mapping

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    SpecKey,
    SpecValue,
    constructor_arguments,
    enum_list_key,
    key_table,
)


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
