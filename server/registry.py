"""The partitioners this server hosts, the spec keys each accepts, and how to build one.

A client names a hosted partitioner (``"xnnpack"``, ``"coreml"``, ``"vulkan"`` or a
plugin's name) and sends a *spec*: a flat mapping from spec key to a scalar
(:data:`SpecValue`). The registry type-checks the spec against the partitioner's
declared :class:`SpecKey` s and builds the ExecuTorch ``Partitioner`` from it.

This module is the generic part: :class:`SpecKey`, :class:`HostedPartitioner`,
:class:`Registry`, the helpers that declare spec keys (:func:`enum_key`, :func:`list_key`,
...), entry-point plugins and :func:`default_registry`. Each built-in partitioner lives in its
own module under ``server/backends/`` (:data:`BUILTIN_BACKENDS`).

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
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.proto.transport import HOOKS

logger = logging.getLogger(__name__)

SpecValue = bool | int | float | str | bytes
"""The scalar types a spec value may have."""

_SPEC_TYPES: tuple[type, ...] = (bool, int, float, str, bytes)

ENTRY_POINT_GROUP = "remote_partitioner.partitioners"
"""Entry point group through which other packages add hosted partitioners."""

_T = TypeVar("_T")
_H = TypeVar("_H")


class UnknownNameError(KeyError):
    """The base of the errors a :class:`NamedRegistry` raises for a name it does not hold:
    ``(name, hosted names)``.

    Attributes:
        name: The requested name.
        hosted: The hosted names, sorted.
    """

    def __init__(self, name: str, hosted: Iterable[str]) -> None:
        super().__init__(name)
        self.name = name
        self.hosted = tuple(sorted(hosted))


class UnknownPartitionerError(UnknownNameError):
    """Raised when a client names a partitioner the server does not host."""

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


def validate_spec(
    name: str, spec_keys: Mapping[str, SpecKey], spec: Mapping[str, object]
) -> dict[str, SpecValue]:
    """Type-checks a client's spec against the hosted object ``name``'s ``spec_keys`` (one
    check for partitioners and quantizers).

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
        key = spec_keys.get(raw_key) if isinstance(raw_key, str) else None
        if key is None:
            accepted = sorted(spec_keys)
            raise InvalidSpecError(
                str(raw_key),
                "",
                f"{name}: unknown spec key {raw_key!r}; accepted keys: "
                f"{', '.join(accepted) or '(none)'}",
                accepted,
            )
        expected = key.type.__name__
        if not _type_matches(key.type, value):
            raise InvalidSpecError(
                key.name,
                expected,
                f"{name}: spec key {key.name!r} expects {expected}, "
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
                    key.name, expected, f"{name}: spec key {key.name!r}: {e}", key.choices
                ) from e
        validated[key.name] = checked
    return validated


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
        """Type-checks a client's spec (:func:`validate_spec`)."""
        return validate_spec(self.name, self.spec_keys, spec)

    def create(self, spec: Mapping[str, object]) -> Partitioner:
        """Validates ``spec`` and builds a partitioner instance from it.

        Raises:
            InvalidSpecError: See ``validate``; also for invalid key combinations.
        """
        return self.factory(self.validate(spec))


class NamedRegistry(Generic[_H]):
    """Hosted objects (partitioners, quantizers) by unique ``name``.

    Subclasses set ``kind`` (the word in messages) and ``unknown`` (the error :meth:`get`
    raises, built as ``unknown(name, hosted_names)``)."""

    kind: ClassVar[str] = "object"
    unknown: ClassVar[type[UnknownNameError]] = UnknownNameError

    def __init__(self, hosted: Iterable[_H] = ()) -> None:
        self._hosted: dict[str, _H] = {}
        for h in hosted:
            self.register(h)

    def register(self, hosted: _H) -> None:
        """Adds a hosted object. Raises ValueError if its name is taken."""
        name = hosted.name  # type: ignore[attr-defined]
        if name in self._hosted:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._hosted[name] = hosted

    def names(self) -> list[str]:
        """Returns the hosted names, sorted."""
        return sorted(self._hosted)

    def get(self, name: str) -> _H:
        """Returns the hosted object ``name``; raises ``unknown``."""
        try:
            return self._hosted[name]
        except KeyError:
            raise type(self).unknown(name, self._hosted) from None

    def __iter__(self) -> Iterator[_H]:
        return iter([self._hosted[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._hosted)

    def __contains__(self, name: object) -> bool:
        return name in self._hosted


class Registry(NamedRegistry[HostedPartitioner]):
    """The set of hosted partitioners, by unique name."""

    kind = "partitioner"
    unknown = UnknownPartitionerError

    def create(self, name: str, spec: Mapping[str, object]) -> Partitioner:
        """Builds partitioner ``name`` from ``spec``.

        Raises:
            UnknownPartitionerError: ``name`` is not hosted.
            InvalidSpecError: ``spec`` does not fit its spec keys.
        """
        return self.get(name).create(spec)


# --- spec key helpers, for the backends under server/backends/ and for plugins --------


def split_list(value: str) -> list[str]:
    """The items of a comma-separated string, stripped, empty items dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


def member(table: Mapping[str, _T], value: str) -> _T:
    """The entry of ``table`` that ``value`` names, case-insensitively (surrounding
    whitespace ignored); ValueError naming the accepted names otherwise."""
    by_lower = {name.lower(): entry for name, entry in table.items()}
    try:
        return by_lower[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{value!r} is not one of: {', '.join(table)}") from None


def members(table: Mapping[str, _T], value: str) -> list[_T]:
    """The entries of ``table`` that a comma-separated ``value`` names, in its order (see
    :func:`member`); ValueError for an unknown name or an entry named twice."""
    parsed = [member(table, item) for item in split_list(value)]
    for i, entry in enumerate(parsed):
        if entry in parsed[:i]:
            raise ValueError(f"{value!r} names {split_list(value)[i]!r} twice")
    return parsed


def enum_key(name: str, table: Mapping[str, Any], default: str | None, doc: str) -> SpecKey:
    """A string key naming one entry of ``table`` (e.g. an ``Enum``'s ``__members__``); the
    constructor gets the entry."""
    return SpecKey(name, str, default, doc, tuple(table), lambda v: member(table, v))


def enum_list_key(name: str, table: Mapping[str, Any], doc: str) -> SpecKey:
    """A comma-separated string key naming several entries of ``table``; the constructor
    gets their list (no default: an absent key leaves the partitioner's own)."""
    return SpecKey(name, str, None, doc, tuple(table), lambda v: members(table, v))


def list_key(name: str, doc: str) -> SpecKey:
    """A comma-separated string key; the constructor gets the list of items."""
    return SpecKey(name, str, None, doc, parse=split_list)


def key_table(*keys: SpecKey) -> dict[str, SpecKey]:
    """``keys`` by name, in order (what :attr:`HostedPartitioner.spec_keys` holds)."""
    return {k.name: k for k in keys}


def constructor_arguments(
    keys: Mapping[str, SpecKey], spec: Mapping[str, SpecValue]
) -> dict[str, Any]:
    """Converts a validated spec into constructor arguments (each key's ``parse`` applied),
    keeping its order; keys absent from ``spec`` stay absent."""
    out: dict[str, Any] = {}
    for name, value in spec.items():
        parse = keys[name].parse
        out[name] = parse(value) if parse is not None else value
    return out


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


#: The built-in backend families: name, and the module under server/backends/ whose
#: ``hosted()`` builds its partitioner(s) (and ``hosted_quantizer()`` its quantizer(s)), in the
#: order they are registered. A family whose toolchain is not installed here is left out.
BUILTIN_BACKENDS: tuple[tuple[str, str], ...] = (
    ("xnnpack", "remote_partitioner.server.backends.xnnpack"),
    ("coreml", "remote_partitioner.server.backends.coreml"),
    ("vulkan", "remote_partitioner.server.backends.vulkan"),
    ("webgpu", "remote_partitioner.server.backends.webgpu"),
    ("arm", "remote_partitioner.server.backends.arm"),
    ("openvino", "remote_partitioner.server.backends.openvino"),
)


def as_list(made: _T | list[_T] | tuple[_T, ...]) -> list[_T]:
    """What a backend module's ``hosted()`` or ``hosted_quantizer()`` made, as a list (a
    family may host several: ``arm`` hosts ``arm_tosa``, ``ethos_u55`` and ``ethos_u85``)."""
    return list(made) if isinstance(made, (list, tuple)) else [made]


def log_unavailable(kind: str, family: str, error: Exception) -> None:
    """Logs why the built-in backend family ``family`` hosts no ``kind``: at INFO when its
    toolchain is not installed in this environment (a ``ModuleNotFoundError`` for a module
    outside this package: expected where a server is built for other backends, e.g. Arm's
    tosa-tools in the main environment), as a warning for anything else."""
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if missing and not missing.startswith("remote_partitioner"):
        logger.info("%s %r not hosted: %s is not installed here", kind, family, missing)
    else:
        logger.warning("%s %r not available: %s: %s", kind, family, type(error).__name__, error)


def builtin_families(only: Iterable[str] | None = None) -> tuple[tuple[str, str], ...]:
    """The entries of :data:`BUILTIN_BACKENDS`: all, or those ``only`` names (in
    :data:`BUILTIN_BACKENDS`'s order).

    Raises:
        ValueError: ``only`` names a family that is not built in.
    """
    if only is None:
        return BUILTIN_BACKENDS
    wanted = set(only)
    unknown = wanted - {name for name, _ in BUILTIN_BACKENDS}
    if unknown:
        raise ValueError(
            f"no built-in backend family {', '.join(map(repr, sorted(unknown)))}; built in: "
            f"{', '.join(name for name, _ in BUILTIN_BACKENDS)}"
        )
    return tuple((name, module) for name, module in BUILTIN_BACKENDS if name in wanted)


def check_family(family: str) -> None:
    """Builds the built-in family ``family``'s hosted partitioners once, so that a server told
    to host it can refuse to start where it cannot (:func:`builtin_partitioners` only logs).

    Raises:
        ValueError: ``family`` is not built in.
        Exception: what importing or building the family raised (``ModuleNotFoundError``
            where its toolchain is not installed).
    """
    ((_, module),) = builtin_families([family])
    with _root_logging_kept():
        importlib.import_module(module).hosted()


def from_families(maker: str, kind: str, only: Iterable[str] | None = None) -> list[Any]:
    """What the function ``maker`` of each built-in family's module makes (``hosted``,
    ``hosted_quantizer``, ``hosted_backends``: one object or a list), as one list in family
    order, for the families ``only`` names (default every one, :func:`builtin_families`).

    A module without ``maker`` adds nothing; a family that cannot be imported or built here is
    left out (:func:`log_unavailable`, as a ``kind``); the root logger is left as it was. Never
    raises (but for an unknown family in ``only``: ValueError).
    """
    made: list[Any] = []
    for name, module in builtin_families(only):
        try:
            with _root_logging_kept():
                make = getattr(importlib.import_module(module), maker, None)
                if make is not None:
                    made.extend(as_list(make()))
        except Exception as e:
            log_unavailable(kind, name, e)
    return made


def builtin_partitioners(only: Iterable[str] | None = None) -> list[HostedPartitioner]:
    """Returns the built-in hosted partitioners whose backend imports here, of the families
    ``only`` names (default: every family): each family module's ``hosted()``
    (:func:`from_families`)."""
    return from_families("hosted", "partitioner", only)


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


def default_registry(*, plugins: bool = True, only: Iterable[str] | None = None) -> Registry:
    """Returns a registry of the built-in partitioners (of the families ``only`` names, default
    all) and, if ``plugins``, entry points.

    A plugin whose name is already registered is logged and skipped.
    """
    registry = Registry(builtin_partitioners(only))
    if plugins:
        for hosted in load_entry_points():
            if hosted.name in registry:
                logger.warning("skipping plugin partitioner %r: name already taken", hosted.name)
            else:
                registry.register(hosted)
    return registry
