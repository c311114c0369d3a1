"""The PT2E quantizers this server hosts, the spec keys each accepts, and how to build one.

A client without a backend's toolchain quantizes through the ``Quantize`` RPC: it names a
hosted quantizer (``"xnnpack"``, ``"vulkan"``, ``"coreml"`` or a plugin's name) and sends a
*spec*, a flat mapping from spec key to a scalar (:data:`~.registry.SpecValue`), and the
server builds a torchao ``Quantizer`` (``torchao.quantization.pt2e.quantizer.Quantizer``) from
it, a fresh one per call, exactly as a local user of the backend would build it.

This module mirrors :mod:`remote_partitioner.server.registry` and reuses its spec key
machinery (:class:`~.registry.SpecKey`, :func:`~.registry.key_table`,
:func:`~.registry.constructor_arguments`, ...), so a spec is checked exactly as a
partitioner's is: the same :class:`~.registry.InvalidSpecError` for an unknown, ill-typed or
unparsable key. Each built-in quantizer is built by ``hosted_quantizer()`` in its backend's
module under ``server/backends/``, called in the order of
:data:`~.registry.BUILTIN_BACKENDS`; a backend module without ``hosted_quantizer`` hosts no
quantizer. Other packages add hosted quantizers through the entry point group
:data:`ENTRY_POINT_GROUP` (``remote_partitioner.quantizers``), as partitioners are added
through ``remote_partitioner.partitioners``.

Contract shared by every hosted quantizer: a key the client did not send is not passed to the
backend's configuration function (unless the quantizer's ``hosted_quantizer`` documents a
fixed base configuration, as Core ML's does), so an empty spec builds what the backend's own
usual configuration builds; spec keys map one-to-one onto options the installed ExecuTorch and
torchao code really reads.

This module is plain Python: it imports neither grpc nor protobuf code, nor torchao until a
:class:`HostedQuantizer` is made.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from remote_partitioner.server.registry import (
    InvalidSpecError,
    NamedRegistry,
    SpecKey,
    SpecValue,
    UnknownNameError,
    from_families,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "remote_partitioner.quantizers"
"""Entry point group through which other packages add hosted quantizers."""

__all__ = [
    "ENTRY_POINT_GROUP",
    "HostedQuantizer",
    "InvalidSpecError",
    "QuantizerRegistry",
    "UnknownQuantizerError",
    "builtin_quantizers",
    "default_quantizers",
    "load_entry_points",
]


class UnknownQuantizerError(UnknownNameError):
    """Raised when a client names a quantizer the server does not host."""

    def __str__(self) -> str:
        return (
            f"this server hosts no quantizer {self.name!r}; "
            f"hosted: {', '.join(self.hosted) or '(none)'}"
        )


@dataclass(frozen=True)
class HostedQuantizer:
    """A PT2E quantizer the server hosts.

    Attributes:
        name: The name clients use, e.g. "xnnpack".
        backend_id: The backend whose quantizer it is, e.g. "XnnpackBackend".
        spec_keys: The accepted spec keys, by name.
        factory: Builds a fresh quantizer from a validated spec (only the keys the client
            gave, already type-checked, in the client's order). May raise InvalidSpecError for
            constraints between keys; anything else it raises is the backend refusing the
            configuration.
        quantizer_class: The torchao ``Quantizer`` subclass the factory builds.
        description: One line for humans.
        loads_quantized_kernels: Importing the backend's quantizer package loads ExecuTorch's
            quantized operators' out variants (``executorch.kernels.quantized``): the client
            loads them too (``QuantizerInfo.loads_quantized_kernels``).
    """

    name: str
    backend_id: str
    spec_keys: Mapping[str, SpecKey]
    factory: Callable[[Mapping[str, SpecValue]], Quantizer]
    quantizer_class: type
    description: str = ""
    loads_quantized_kernels: bool = False

    def __post_init__(self) -> None:
        from torchao.quantization.pt2e.quantizer import Quantizer

        if not (
            isinstance(self.quantizer_class, type) and issubclass(self.quantizer_class, Quantizer)
        ):
            raise TypeError(
                f"{self.name}: {self.quantizer_class!r} is not a torchao Quantizer subclass"
            )
        for key_name, key in self.spec_keys.items():
            if key_name != key.name:
                raise ValueError(f"{self.name}: spec key {key.name!r} registered as {key_name!r}")

    def validate(self, spec: Mapping[str, object]) -> dict[str, SpecValue]:
        """Type-checks a client's spec, exactly as ``HostedPartitioner.validate`` does (an
        int is accepted for a float key; never a bool for an int key nor an int for a bool
        key; each key's ``parse`` is run so that a bad value fails here).

        Returns:
            The spec's keys, in the client's order, with checked values; keys the client did
            not send are absent.

        Raises:
            InvalidSpecError: A key is not accepted, or its value has the wrong type or does
                not parse.
        """
        from remote_partitioner.server.registry import validate_spec

        return validate_spec(self.name, self.spec_keys, spec)

    def build(self, spec: Mapping[str, object]) -> Quantizer:
        """Validates ``spec`` and builds a fresh quantizer from it.

        Raises:
            InvalidSpecError: See ``validate``; also for invalid key combinations.
            Exception: Whatever the backend's configuration code raises for a spec it refuses
                (e.g. torchao's ValueError for ``act_qmin`` above ``act_qmax``).
        """
        return self.factory(self.validate(spec))

    #: ``build``, under the name :class:`~.registry.HostedPartitioner` uses.
    create = build


class QuantizerRegistry(NamedRegistry[HostedQuantizer]):
    """The set of hosted quantizers, by unique name."""

    kind = "quantizer"
    unknown = UnknownQuantizerError

    def build(self, name: str, spec: Mapping[str, object]) -> Quantizer:
        """Builds a fresh quantizer ``name`` from ``spec``.

        Raises:
            UnknownQuantizerError: ``name`` is not hosted.
            InvalidSpecError: ``spec`` does not fit its spec keys.
        """
        return self.get(name).build(spec)

    #: ``build``, under the name :class:`~.registry.Registry` uses.
    create = build


def builtin_quantizers(only: Iterable[str] | None = None) -> QuantizerRegistry:
    """Returns a registry of the built-in hosted quantizers whose backend imports here: each
    family module's ``hosted_quantizer()``, for the families ``only`` names (default every one;
    :func:`~.registry.from_families`: a family that cannot be imported here is left out and
    logged, never raised)."""
    return QuantizerRegistry(from_families("hosted_quantizer", "quantizer", only))


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[HostedQuantizer]:
    """Returns the hosted quantizers that installed packages declare in ``group``.

    Each entry point loads to a HostedQuantizer, or to a zero-argument callable returning one
    or a list of them. A plugin that fails to load, raises, or returns anything else is
    logged as a warning and skipped.
    """
    hosted: list[HostedQuantizer] = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            obj = ep.load()
            if not isinstance(obj, HostedQuantizer):
                obj = obj()
            found = list(obj) if isinstance(obj, (list, tuple)) else [obj]
            bad = [f for f in found if not isinstance(f, HostedQuantizer)]
            if bad:
                raise TypeError(f"expected HostedQuantizer, got {type(bad[0]).__name__}")
        except Exception as e:
            logger.warning(
                "skipping quantizer plugin %s = %s: %s: %s", ep.name, ep.value, type(e).__name__, e
            )
            continue
        hosted.extend(found)
    return hosted


def default_quantizers(
    *, plugins: bool = True, only: Iterable[str] | None = None
) -> QuantizerRegistry:
    """Returns :func:`builtin_quantizers` (of the families ``only`` names, default all) plus,
    if ``plugins``, the entry points' quantizers (:func:`load_entry_points`); a plugin whose
    name is already registered is logged and skipped."""
    registry = builtin_quantizers(only)
    if plugins:
        for hosted in load_entry_points():
            if hosted.name in registry:
                logger.warning("skipping plugin quantizer %r: name already taken", hosted.name)
            else:
                registry.register(hosted)
    return registry
