"""The built-in hosted partitioners, one module per ExecuTorch backend (as ExecuTorch lays out
``executorch/backends/``): :mod:`.xnnpack`, :mod:`.coreml`, :mod:`.vulkan`.

Each module defines ``hosted() -> HostedPartitioner``, which imports its backend (ExecuTorch
and any SDK it needs) only when called and raises if the backend cannot be imported; importing
the module itself is cheap. :func:`remote_partitioner.server.registry.builtin_partitioners`
calls them in the order of ``registry.BUILTIN_BACKENDS`` and leaves out those that raise. A
new built-in backend is a new module here plus a line in ``BUILTIN_BACKENDS``; a partitioner
from another package registers through the ``remote_partitioner.partitioners`` entry points
instead.
"""
