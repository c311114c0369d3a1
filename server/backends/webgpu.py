"""The hosted ``webgpu`` partitioner: ExecuTorch's ``WebGPUPartitioner``, the WebGPU frontend of
the Vulkan path. It partitions with a ``VulkanPartitioner`` built from its own arguments and
delegates to ``VulkanBackend`` (the WebGPU runtime reads Vulkan's serialization), so its spec
keys are Vulkan's (:func:`.vulkan.partitioner_keys`) and its preprocess is Vulkan's, hosted by
the ``vulkan`` family. ExecuTorch's ``webgpu`` suite flow restricts it to the operators the
WebGPU runtime implements with ``operator_allowlist`` (its tester's ``WEBGPU_SUPPORTED_OPS``);
a client sends that list as the key's comma-separated operator names.

No toolchain beyond ExecuTorch's wheel: hosted in the main environment, beside Vulkan.
"""

from __future__ import annotations

from collections.abc import Mapping

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import HostedPartitioner, SpecValue


def hosted() -> HostedPartitioner:
    """The hosted ``webgpu`` partitioner (imports ExecuTorch's WebGPU and Vulkan backends;
    raises if they cannot be imported)."""
    from executorch.backends.webgpu.partitioner import WebGPUPartitioner

    from remote_partitioner.server.backends.vulkan import (
        partitioner_arguments,
        partitioner_keys,
    )

    keys = partitioner_keys()

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        return WebGPUPartitioner(**partitioner_arguments(keys, spec))

    return HostedPartitioner(
        "webgpu",
        "VulkanBackend",
        keys,
        factory,
        WebGPUPartitioner,
        "WebGPU: Vulkan's partitioning and serialization for the WebGPU runtime",
    )
