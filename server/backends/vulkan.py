"""The hosted ``vulkan`` partitioner and quantizer: ExecuTorch's ``VulkanPartitioner`` (its spec
keys, and the compile options they become) and ``VulkanQuantizer``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    SpecKey,
    SpecValue,
    constructor_arguments,
    enum_key,
    key_table,
    list_key,
    split_list,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

    from remote_partitioner.server.backend_registry import HostedBackend
    from remote_partitioner.server.quantizers import HostedQuantizer

_VULKAN_CONSTRUCTOR_KEYS = (
    "operator_blocklist",
    "operator_allowlist",
    "nn_module_blocklist",
    "nn_module_allowlist",
)


def _texture_limits(value: str) -> tuple[int, int, int]:
    parts = split_list(value)
    try:
        x, y, z = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{value!r} is not three comma-separated integers x,y,z") from None
    if min(x, y, z) <= 0:
        raise ValueError(f"{value!r}: texture limits must be positive")
    return (x, y, z)


def _positive(limit: int) -> Callable[[int], int]:
    def parse(value: int) -> int:
        if not 0 < value < limit:
            raise ValueError(f"{value} is not in 1..{limit - 1}")
        return value

    return parse


def _edge_ops(value: str) -> list[object]:
    """Parses comma-separated operator names into the keys Vulkan's op lists hold.

    ``namespace.op[.overload]`` (overload defaults to "default") resolves to the edge
    dialect operator, e.g. ``aten.add.Tensor`` to ``exir_ops.edge.aten.add.Tensor``;
    a ``namespace::op`` name (a custom op under auto_functionalized) stays a string.
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    ops: list[object] = []
    for item in split_list(value):
        if "::" in item:
            ops.append(item)
            continue
        parts = item.split(".")
        if len(parts) == 2:
            parts.append("default")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"{item!r} is not an operator name namespace.op.overload (e.g. aten.add.Tensor) "
                "or namespace::op"
            )
        try:
            ops.append(getattr(getattr(getattr(exir_ops.edge, parts[0]), parts[1]), parts[2]))
        except Exception:
            raise ValueError(f"{item!r} is not a known edge dialect operator") from None
    return ops


def partitioner_keys() -> dict[str, SpecKey]:
    """The spec keys of ``VulkanPartitioner``'s arguments (``compile_options`` entries, then
    its constructor's lists), which :func:`partitioner_arguments` turns into them; WebGPU's
    partitioner takes the same (:mod:`.webgpu`). Imports ExecuTorch's Vulkan backend."""
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import (
        VkMemoryLayout,
        VkStorageType,
    )

    return key_table(
        # compile_options, read by the partitioner and/or VulkanBackend.preprocess
        SpecKey(
            "texture_limits",
            str,
            None,
            "x,y,z image texture limits; default 16384,16384,2048 (2048,2048,2048 if small)",
            parse=_texture_limits,
        ),
        SpecKey("small_texture_limits", bool, False, "use 2048,2048,2048 texture limits"),
        SpecKey(
            "buffer_limit",
            int,
            None,
            "buffer numel limit handed to the op support check (unused there in 1.5.1)",
            parse=_positive(1 << 63),
        ),
        SpecKey("require_dynamic_shapes", bool, False, "only delegate ops that support resizing"),
        SpecKey("skip_bool_tensors", bool, False, "do not delegate ops with bool tensors"),
        enum_key(
            "storage_type_override",
            VkStorageType.__members__,
            None,
            "default tensor storage (VkStorageType); default TEXTURE_3D",
        ),
        enum_key(
            "memory_layout_override",
            VkMemoryLayout.__members__,
            None,
            "default tensor memory layout (VkMemoryLayout); default TENSOR_WIDTH_PACKED",
        ),
        SpecKey("skip_tag_memory_metadata", bool, False, "skip the TagMemoryMetaPass"),
        SpecKey("downcast_64_bit", bool, True, "store 64-bit tensors as 32-bit"),
        SpecKey("force_fp16", bool, False, "run float32 tensors as float16"),
        SpecKey("skip_memory_planning", bool, False, "skip memory planning in preprocess"),
        SpecKey("alias_buffer_mutations", bool, False, "alias mutated buffers instead of copying"),
        SpecKey(
            "external_constants_max_data_bytes",
            int,
            None,
            "move constants into named data chunks of at most this many bytes",
            parse=_positive(1 << 64),
        ),
        # constructor arguments
        SpecKey(
            "operator_blocklist",
            str,
            None,
            "comma-separated ops never delegated, e.g. aten.add.Tensor",
            parse=_edge_ops,
        ),
        SpecKey(
            "operator_allowlist",
            str,
            None,
            "comma-separated ops that alone may be delegated (torch ops only)",
            parse=_edge_ops,
        ),
        list_key("nn_module_blocklist", "comma-separated nn.Module type name substrings to skip"),
        list_key("nn_module_allowlist", "comma-separated nn.Module type name substrings to keep"),
    )


def partitioner_arguments(
    keys: Mapping[str, SpecKey], spec: Mapping[str, SpecValue]
) -> dict[str, Any]:
    """The keyword arguments of ``VulkanPartitioner`` (or ``WebGPUPartitioner``) a validated
    spec describes: its constructor's lists, and ``compile_options`` holding the other keys in
    the client's order (bool and enum options become compile specs in this order); none of
    them when the spec is empty, as the no-argument constructor."""
    args = constructor_arguments(keys, spec)
    options = {k: v for k, v in args.items() if k not in _VULKAN_CONSTRUCTOR_KEYS}
    kwargs = {k: v for k, v in args.items() if k in _VULKAN_CONSTRUCTOR_KEYS}
    if options:
        kwargs["compile_options"] = options
    return kwargs


def hosted() -> HostedPartitioner:
    """The hosted ``vulkan`` partitioner (imports ExecuTorch's Vulkan backend; raises if it
    cannot be imported)."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    keys = partitioner_keys()

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        return VulkanPartitioner(**partitioner_arguments(keys, spec))

    return HostedPartitioner(
        "vulkan",
        "VulkanBackend",
        keys,
        factory,
        VulkanPartitioner,
        "Vulkan: GPU compute shaders",
    )


def _one_of(*accepted: int) -> Callable[[int], int]:
    def parse(value: int) -> int:
        if value not in accepted:
            raise ValueError(f"{value} is not one of {', '.join(map(str, accepted))}")
        return value

    return parse


def _int8(value: int) -> int:
    if not -128 <= value <= 127:
        raise ValueError(f"{value} is not in the int8 range -128..127")
    return value


def hosted_quantizer() -> HostedQuantizer:
    """The hosted ``vulkan`` quantizer (imports ExecuTorch's Vulkan quantizer; raises if it
    cannot be imported): ``VulkanQuantizer().set_global(get_symmetric_quantization_config(
    **spec))``, a fresh quantizer per call, its spec keys the configuration function's
    arguments with its defaults (weight-only int8 per channel by default).

    As XNNPACK's, the configuration function is ``functools.lru_cache``d and is called with
    keyword arguments only, exactly the keys the client sent, in its parameter order.
    """
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )

    from remote_partitioner.server.quantizers import HostedQuantizer

    keys = key_table(
        SpecKey("is_dynamic", bool, False, "dynamic: int8 per-token activations, else weight-only"),
        SpecKey("weight_bits", int, 8, "weight bits: 8 or 4", parse=_one_of(8, 4)),
        SpecKey("act_bits", int, 8, "activation bits: 8 (the only one)", parse=_one_of(8)),
        SpecKey("act_qmin", int, None, "activation quant_min; default by act_bits", parse=_int8),
        SpecKey("act_qmax", int, None, "activation quant_max; default by act_bits", parse=_int8),
        SpecKey("weight_qmin", int, None, "weight quant_min; default by weight_bits", parse=_int8),
        SpecKey("weight_qmax", int, None, "weight quant_max; default by weight_bits", parse=_int8),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Quantizer:
        args = constructor_arguments(keys, spec)
        config = get_symmetric_quantization_config(**{k: args[k] for k in keys if k in args})
        return VulkanQuantizer().set_global(config)

    return HostedQuantizer(
        "vulkan",
        "VulkanBackend",
        keys,
        factory,
        VulkanQuantizer,
        "Vulkan: int8 or int4 per-channel weights for linear, weight-only or dynamic",
    )


def hosted_backends() -> list[HostedBackend]:
    """The backend whose ``preprocess`` the server runs for ``vulkan`` (the ``Preprocess`` RPC):
    ExecuTorch's ``VulkanBackend``."""
    from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend

    from remote_partitioner.server.backend_registry import HostedBackend

    return [HostedBackend(VulkanBackend, "ExecuTorch's VulkanBackend (Vulkan's preprocess)")]
