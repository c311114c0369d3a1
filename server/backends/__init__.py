"""The built-in hosted partitioners and quantizers, one module per ExecuTorch backend (as
ExecuTorch lays out ``executorch/backends/``): :mod:`.xnnpack`, :mod:`.coreml`, :mod:`.vulkan`,
:mod:`.webgpu`, and, each in an environment of its own, :mod:`.arm` and :mod:`.openvino`.

Each module defines ``hosted() -> HostedPartitioner`` and may define ``hosted_quantizer() ->
HostedQuantizer`` (the backend's PT2E quantizer, for the ``Quantize`` RPC); each imports its
backend (ExecuTorch and any SDK it needs) only when called and raises if the backend cannot be
imported; importing the module itself is cheap.
:func:`remote_partitioner.server.registry.builtin_partitioners` and
:func:`remote_partitioner.server.quantizers.builtin_quantizers` call them in the order of
``registry.BUILTIN_BACKENDS`` and leave out those that raise. A new built-in backend is a new
module here plus a line in ``BUILTIN_BACKENDS``; a partitioner or quantizer from another
package registers through the ``remote_partitioner.partitioners`` or
``remote_partitioner.quantizers`` entry points instead.
"""
