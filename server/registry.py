"""The partitioners this server hosts, the spec keys each accepts, and how to build one.

A client names a hosted partitioner (``"xnnpack"``, ``"coreml"``, ``"vulkan"`` or a
plugin's name) and sends a *spec*: a flat mapping from spec key to a scalar
(:data:`SpecValue`). The registry type-checks the spec against the partitioner's
declared :class:`SpecKey` s and builds the ExecuTorch ``Partitioner`` from it.

Contract shared by every hosted partitioner:

* A key the client did not send is not passed to the constructor at all, so
  ``create(name, {})`` builds exactly what the partitioner's no-argument constructor
  builds (remote lowering is compared byte for byte against local lowering).
* Lists travel as comma-separated strings, enums as a string naming the member
  (case-insensitive).
* Spec keys map one-to-one onto options the installed ExecuTorch code really reads.

This module is plain Python: it imports neither grpc nor protobuf code. :data:`HOOKS` is
:data:`remote_partitioner.proto.transport.HOOKS`, re-exported.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.metadata
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.proto.transport import HOOKS

logger = logging.getLogger(__name__)

SpecValue = bool | int | float | str | bytes
"""The scalar types a spec value may have."""

_SPEC_TYPES: tuple[type, ...] = (bool, int, float, str, bytes)

ENTRY_POINT_GROUP = "remote_partitioner.partitioners"
"""Entry point group through which other packages add hosted partitioners."""

_T = TypeVar("_T")


class UnknownPartitionerError(KeyError):
    """Raised when a client names a partitioner the server does not host.

    Attributes:
        name: The requested name.
        hosted: The hosted names, sorted.
    """

    def __init__(self, name: str, hosted: Iterable[str]) -> None:
        super().__init__(name)
        self.name = name
        self.hosted = tuple(sorted(hosted))

    def __str__(self) -> str:
        return f"unknown partitioner {self.name!r}; hosted: {', '.join(self.hosted) or '(none)'}"


class InvalidSpecError(ValueError):
    """Raised when a spec does not fit the partitioner's spec keys.

    Attributes:
        key: The offending spec key (as the client sent it).
        expected: Name of the type the key takes ("bool", "int", "float", "str",
            "bytes"); empty for a key the partitioner does not accept.
        accepted: The accepted keys (unknown key) or accepted values (bad enum or
            operator name); empty otherwise.
    """

    def __init__(self, key: str, expected: str, message: str, accepted: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.accepted = tuple(accepted)


@dataclass(frozen=True)
class SpecKey:
    """One option a hosted partitioner accepts.

    Attributes:
        name: The key as the client sends it.
        type: One of ``bool``, ``int``, ``float``, ``str``, ``bytes``.
        default: What the partitioner uses when the key is absent (informational;
            absent keys are never filled in). ``None`` means "the partitioner's own
            default", described in ``doc``.
        doc: One line describing the option.
        choices: For enum-like string keys, the accepted member names (for a
            comma-separated key, the accepted items).
        parse: Converts the type-checked scalar into the constructor's argument;
            raises ``ValueError`` with a message naming the accepted values.
    """

    name: str
    type: builtins.type
    default: SpecValue | None
    doc: str
    choices: tuple[str, ...] = ()
    parse: Callable[[Any], object] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.type not in _SPEC_TYPES:
            raise TypeError(f"spec key {self.name!r}: type {self.type!r} is not a spec type")
        if self.default is not None and not _type_matches(self.type, self.default):
            raise TypeError(
                f"spec key {self.name!r}: default {self.default!r} is not a {self.type.__name__}"
            )


def _type_matches(expected: type, value: object) -> bool:
    # bool is an int subclass: keep the two apart in both directions.
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


@dataclass(frozen=True)
class HostedPartitioner:
    """A partitioner the server hosts.

    Attributes:
        name: The name clients use, e.g. "xnnpack".
        backend_id: The backend the partitioner delegates to, e.g. "XnnpackBackend".
        spec_keys: The accepted spec keys, by name.
        factory: Builds the partitioner from a validated spec (only the keys the
            client gave, already type-checked). May raise InvalidSpecError for
            constraints between keys.
        partitioner_class: The ``Partitioner`` subclass the factory builds.
        description: One line for humans.
    """

    name: str
    backend_id: str
    spec_keys: Mapping[str, SpecKey]
    factory: Callable[[Mapping[str, SpecValue]], Partitioner]
    partitioner_class: type
    description: str = ""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.partitioner_class, type)
            and issubclass(self.partitioner_class, Partitioner)
        ):
            raise TypeError(
                f"{self.name}: {self.partitioner_class!r} is not a Partitioner subclass"
            )
        for key_name, key in self.spec_keys.items():
            if key_name != key.name:
                raise ValueError(f"{self.name}: spec key {key.name!r} registered as {key_name!r}")

    def overridden_hooks(self) -> tuple[str, ...]:
        """Returns the names in HOOKS that ``partitioner_class`` overrides.

        A hook counts as overridden when the first definition found along the class's
        MRO is not the function defined on ``Partitioner`` itself.
        """
        overridden = []
        for hook in HOOKS:
            base = Partitioner.__dict__[hook]
            for klass in self.partitioner_class.__mro__:
                if hook in klass.__dict__:
                    if klass.__dict__[hook] is not base:
                        overridden.append(hook)
                    break
        return tuple(overridden)

    def validate(self, spec: Mapping[str, object]) -> dict[str, SpecValue]:
        """Type-checks a client's spec.

        An int is accepted for a float key (and converted); a bool is never accepted
        for an int key, nor an int for a bool key. Enum-like and list-like strings
        are parsed here too, so that a bad member name fails validation.

        Returns:
            The spec's keys, in the client's order, with checked (and for float,
            converted) values. Keys the client did not send are absent.

        Raises:
            InvalidSpecError: A key is not accepted, or its value has the wrong type
                or does not parse.
        """
        validated: dict[str, SpecValue] = {}
        for raw_key, value in spec.items():
            key = self.spec_keys.get(raw_key) if isinstance(raw_key, str) else None
            if key is None:
                accepted = sorted(self.spec_keys)
                raise InvalidSpecError(
                    str(raw_key),
                    "",
                    f"{self.name}: unknown spec key {raw_key!r}; accepted keys: "
                    f"{', '.join(accepted) or '(none)'}",
                    accepted,
                )
            expected = key.type.__name__
            if not _type_matches(key.type, value):
                raise InvalidSpecError(
                    key.name,
                    expected,
                    f"{self.name}: spec key {key.name!r} expects {expected}, "
                    f"got {type(value).__name__} {value!r}",
                )
            checked = cast(SpecValue, value)
            if key.type is float:
                checked = float(checked)
            if key.parse is not None:
                try:
                    key.parse(checked)
                except ValueError as e:
                    raise InvalidSpecError(
                        key.name, expected, f"{self.name}: spec key {key.name!r}: {e}", key.choices
                    ) from e
            validated[key.name] = checked
        return validated

    def create(self, spec: Mapping[str, object]) -> Partitioner:
        """Validates ``spec`` and builds a partitioner instance from it.

        Raises:
            InvalidSpecError: See ``validate``; also for invalid key combinations.
        """
        return self.factory(self.validate(spec))


class Registry:
    """The set of hosted partitioners, by unique name."""

    def __init__(self, hosted: Iterable[HostedPartitioner] = ()) -> None:
        self._hosted: dict[str, HostedPartitioner] = {}
        for h in hosted:
            self.register(h)

    def register(self, hosted: HostedPartitioner) -> None:
        """Adds a hosted partitioner. Raises ValueError if its name is taken."""
        if hosted.name in self._hosted:
            raise ValueError(f"a partitioner named {hosted.name!r} is already registered")
        self._hosted[hosted.name] = hosted

    def names(self) -> list[str]:
        """Returns the hosted names, sorted."""
        return sorted(self._hosted)

    def get(self, name: str) -> HostedPartitioner:
        """Returns the hosted partitioner ``name``; raises UnknownPartitionerError."""
        try:
            return self._hosted[name]
        except KeyError:
            raise UnknownPartitionerError(name, self._hosted) from None

    def create(self, name: str, spec: Mapping[str, object]) -> Partitioner:
        """Builds partitioner ``name`` from ``spec``.

        Raises:
            UnknownPartitionerError: ``name`` is not hosted.
            InvalidSpecError: ``spec`` does not fit its spec keys.
        """
        return self.get(name).create(spec)

    def __iter__(self) -> Iterator[HostedPartitioner]:
        return iter([self._hosted[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._hosted)

    def __contains__(self, name: object) -> bool:
        return name in self._hosted


# --- spec value parsing -------------------------------------------------------


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _member(members: Mapping[str, _T], value: str) -> _T:
    by_lower = {name.lower(): member for name, member in members.items()}
    try:
        return by_lower[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{value!r} is not one of: {', '.join(members)}") from None


def _enum_key(name: str, members: Mapping[str, Any], default: str | None, doc: str) -> SpecKey:
    return SpecKey(name, str, default, doc, tuple(members), lambda v: _member(members, v))


def _members(members: Mapping[str, _T], value: str) -> list[_T]:
    parsed = [_member(members, item) for item in _split(value)]
    for i, member in enumerate(parsed):
        if member in parsed[:i]:
            raise ValueError(f"{value!r} names {_split(value)[i]!r} twice")
    return parsed


def _enum_list_key(name: str, members: Mapping[str, Any], doc: str) -> SpecKey:
    return SpecKey(name, str, None, doc, tuple(members), lambda v: _members(members, v))


def _list_key(name: str, doc: str) -> SpecKey:
    return SpecKey(name, str, None, doc, parse=_split)


def _keys(*keys: SpecKey) -> dict[str, SpecKey]:
    return {k.name: k for k in keys}


def _arguments(keys: Mapping[str, SpecKey], spec: Mapping[str, SpecValue]) -> dict[str, Any]:
    """Converts a validated spec into constructor arguments, keeping its order."""
    out: dict[str, Any] = {}
    for name, value in spec.items():
        parse = keys[name].parse
        out[name] = parse(value) if parse is not None else value
    return out


# --- built-in partitioners ----------------------------------------------------


def _xnnpack() -> HostedPartitioner:
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.xnnpack_config import (
        ConfigPrecisionType,
    )
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    keys = _keys(
        _enum_list_key(
            "configs",
            {c.__name__: c for c in ALL_PARTITIONER_CONFIGS},
            "comma-separated partitioner config classes to use (e.g. LinearConfig); default all",
        ),
        _enum_list_key(
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
        return XnnpackPartitioner(**_arguments(keys, spec))

    return HostedPartitioner(
        "xnnpack",
        "XnnpackBackend",
        keys,
        factory,
        XnnpackPartitioner,
        "XNNPACK: optimized CPU kernels (fp32, fp16, int8 static and dynamic quantization)",
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


def _coreml() -> HostedPartitioner:
    import coremltools as ct
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
    from executorch.backends.apple.coreml.compiler import CoreMLBackend
    from executorch.backends.apple.coreml.compiler.coreml_preprocess import (
        MULTIMETHOD_WEIGHT_SHARING_STRATEGY,
    )
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    keys = _keys(
        _enum_key(
            "compute_unit", ct.ComputeUnit.__members__, "ALL", "coremltools.ComputeUnit member"
        ),
        _enum_key(
            "minimum_deployment_target",
            ct.target.__members__,
            None,
            "coremltools.target member, e.g. iOS17 or macOS14; default coremltools' own",
        ),
        _enum_key(
            "compute_precision",
            ct.precision.__members__,
            "FLOAT16",
            "coremltools.precision member",
        ),
        _enum_key(
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
            lambda v: [_member({p: p for p in PASS_REGISTRY.passes}, i) for i in _split(v)],
        ),
        _enum_key(
            "multimethod_weight_sharing_strategy",
            MULTIMETHOD_WEIGHT_SHARING_STRATEGY.__members__,
            "POSITIONAL",
            "weight sharing across methods: POSITIONAL or DISABLED",
        ),
        _list_key(
            "skip_ops_for_coreml_delegation",
            "comma-separated op names kept out of CoreML, lower case, e.g. aten.mm.default",
        ),
        SpecKey("take_over_mutable_buffer", bool, True, "delegate mutable buffers as CoreML state"),
        SpecKey("lower_full_graph", bool, False, "require the whole graph to be delegated"),
        SpecKey("take_over_constant_data", bool, True, "delegate constant data (weights)"),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        args = _arguments(keys, spec)
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


_VULKAN_CONSTRUCTOR_KEYS = (
    "operator_blocklist",
    "operator_allowlist",
    "nn_module_blocklist",
    "nn_module_allowlist",
)


def _texture_limits(value: str) -> tuple[int, int, int]:
    parts = _split(value)
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
    for item in _split(value):
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


def _vulkan() -> HostedPartitioner:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import (
        VkMemoryLayout,
        VkStorageType,
    )

    keys = _keys(
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
        _enum_key(
            "storage_type_override",
            VkStorageType.__members__,
            None,
            "default tensor storage (VkStorageType); default TEXTURE_3D",
        ),
        _enum_key(
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
        _list_key("nn_module_blocklist", "comma-separated nn.Module type name substrings to skip"),
        _list_key("nn_module_allowlist", "comma-separated nn.Module type name substrings to keep"),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        args = _arguments(keys, spec)
        # Client order is kept: bool and enum options become compile specs in this order.
        options = {k: v for k, v in args.items() if k not in _VULKAN_CONSTRUCTOR_KEYS}
        kwargs = {k: v for k, v in args.items() if k in _VULKAN_CONSTRUCTOR_KEYS}
        if options:
            kwargs["compile_options"] = options
        return VulkanPartitioner(**kwargs)

    return HostedPartitioner(
        "vulkan",
        "VulkanBackend",
        keys,
        factory,
        VulkanPartitioner,
        "Vulkan: GPU compute shaders",
    )


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    # Importing backends reconfigures the root logger (xnnpack calls
    # logging.basicConfig, vulkan sets the root level to INFO); the server owns it.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


_BUILTINS: tuple[tuple[str, Callable[[], HostedPartitioner]], ...] = (
    ("xnnpack", _xnnpack),
    ("coreml", _coreml),
    ("vulkan", _vulkan),
)


def builtin_partitioners() -> list[HostedPartitioner]:
    """Returns the built-in hosted partitioners whose backend imports here.

    A backend whose import fails is logged as a warning and left out; this never
    raises.
    """
    hosted = []
    for name, make in _BUILTINS:
        try:
            with _root_logging_kept():
                hosted.append(make())
        except Exception as e:
            logger.warning("partitioner %r not available: %s: %s", name, type(e).__name__, e)
    return hosted


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> list[HostedPartitioner]:
    """Returns the hosted partitioners that installed packages declare in ``group``.

    Each entry point loads to a HostedPartitioner, or to a zero-argument callable
    returning one or a list of them. A plugin that fails to load, raises, or returns
    anything else is logged as a warning and skipped.
    """
    hosted: list[HostedPartitioner] = []
    for ep in importlib.metadata.entry_points(group=group):
        try:
            obj = ep.load()
            if not isinstance(obj, HostedPartitioner):
                obj = obj()
            found = list(obj) if isinstance(obj, (list, tuple)) else [obj]
            bad = [f for f in found if not isinstance(f, HostedPartitioner)]
            if bad:
                raise TypeError(f"expected HostedPartitioner, got {type(bad[0]).__name__}")
        except Exception as e:
            logger.warning(
                "skipping partitioner plugin %s = %s: %s: %s",
                ep.name,
                ep.value,
                type(e).__name__,
                e,
            )
            continue
        hosted.extend(found)
    return hosted


def default_registry(*, plugins: bool = True) -> Registry:
    """Returns a registry of the built-in partitioners and, if ``plugins``, entry points.

    A plugin whose name is already registered is logged and skipped.
    """
    registry = Registry(builtin_partitioners())
    if plugins:
        for hosted in load_entry_points():
            if hosted.name in registry:
                logger.warning("skipping plugin partitioner %r: name already taken", hosted.name)
            else:
                registry.register(hosted)
    return registry
