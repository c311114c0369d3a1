"""Reading PT2 archives (``torch.export.save``, ``package_pt2``) without running their content.

``torch.export.load`` unpickles: the sample inputs always, weights and constants that were saved
with ``use_pickle`` (tensor subclasses), custom and opaque objects, legacy ``.pt`` weights. And
the program JSON it deserializes can make torch run code even with no pickle in sight:

* symbolic sizes (``SymExpr.expr_str``) go to ``sympy.sympify``, which ``eval``s them;
* graph input names become parameters of the ``def forward(...)`` that FX generates and
  ``exec``s (``name = "x=__import__('os')..."``); attribute paths go into ``getattr(self, "...")``
  string literals; ``forward_arg_names`` and the keyword names of ``in_spec`` go into the code
  ``ExportedProgram.module()`` generates;
* ``guards_code`` is Python source that ``ExportedProgram.module()`` ``exec``s;
* ``as_operator`` arguments name any attribute of ``torch``, ``operator`` or ``math``.

:func:`read_pt2` reads the same format with none of that: the zip is read in memory with
:mod:`zipfile`, no pickle is ever loaded (sample inputs are not read at all), and the program JSON
is checked (node targets by :func:`remote_partitioner.proto.codec.checked_graph_json`, the rest
here) before torch's deserializer sees it. What it can read comes back as the same
``ExportedProgram`` that ``torch.export.load`` gives (graph, signature, state_dict and constant
values, aliasing, range constraints, module call graph), except that ``example_inputs`` is None.

Torch's own pieces are used wherever they do not unpickle: the archive layout constants
(``torch.export.pt2_archive.constants``), the payload config reader (``_load_payload_config``),
the flat payload builder (``_build_file_map``), the export schema and its JSON reader
(``_dict_to_dataclass``), and ``ExportedProgramDeserializer``. The zip reader is ours (torch's
``PT2ArchiveReader`` is C++ over the whole buffer with no member checks); it presents the part of
``PT2ArchiveReader``'s interface that those functions use. What is re-implemented is
``_load_state_dict``/``_load_constants``/``_load_exported_programs``, i.e. the parts that call
``torch.load``/``pickle.loads``/``torch._C._pickle_load_obj``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
import threading
import tokenize
import typing
import zipfile
from collections import OrderedDict, defaultdict
from enum import Enum
from types import NoneType, UnionType
from typing import Any, cast

import torch
import torch.utils._pytree as pytree
from torch._export.serde import schema
from torch._export.serde.serialize import (
    ExportedProgramDeserializer,
    _dict_to_dataclass,
    _resolve_schema_cls,
    deserialize_scalar_type,
    deserialize_size,
    deserialize_storage_offset,
    deserialize_stride,
)
from torch._export.serde.union import _Union
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as pt2c
from torch.export.pt2_archive._package import (
    PT2ArchiveReader,
    _build_file_map,
    _load_payload_config,
)
from torch.utils._sympy.symbol import prefix_str

from remote_partitioner.proto.codec import ProgramDecodeError, check_target, checked_graph_json

__all__ = ["ArchiveError", "UnsafeArchiveError", "read_pt2"]


class UnsafeArchiveError(ValueError):
    """The archive can only be read by running something it holds: a pickle (weights or
    constants saved with ``use_pickle``, custom objects, opaque objects, legacy ``.pt`` weights
    or an archive of the pre-PT2 format) or Python source torch would execute (``guards_code``).
    The message names the archive member or field, and why."""


class ArchiveError(ValueError):
    """The archive is not a readable PT2 archive: not a zip, a refused member name, too many or
    too large members, missing files, a malformed config or program, a tensor that does not fit
    in its payload, an unknown dtype, a program that names something other than an operator
    (the :class:`~remote_partitioner.proto.codec.ProgramDecodeError` is the ``__cause__``)."""


# --------------------------------------------------------------------------------------------
# The zip, in memory


def _check_member_name(name: str) -> None:
    """Refuse names that would escape a directory if anyone ever extracted the archive."""
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or name.startswith("/")
        or re.match(r"^[A-Za-z]:", name)
        or ".." in name.split("/")
    ):
        raise ArchiveError(f"archive member name {name[:200]!r} is refused (path traversal)")


class _MemoryArchive:
    """A PT2 archive's members, read from memory with :mod:`zipfile`.

    Member names are checked, counted and their declared uncompressed sizes summed before
    anything is read. Records are named as ``torch._C.PyTorchFileReader`` names them: without
    the root folder every member lives under. It offers what torch's ``_load_payload_config``
    and ``_build_file_map`` use of a ``PT2ArchiveReader`` (``read_string``, ``read_bytes``,
    ``get_file_names``, ``archive_file.get_record_size``/``get_storage_from_record``).
    """

    def __init__(
        self, data: bytes | memoryview, max_members: int, max_uncompressed_bytes: int | None
    ) -> None:
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
            infos = self._zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
            raise ArchiveError(f"not a zip archive: {e}") from None
        if len(infos) > max_members:
            raise ArchiveError(f"the archive has {len(infos)} members, more than {max_members}")
        for info in infos:  # torch.export.load's fallback for archives older than PT2
            if info.filename in ("serialized_state_dict.pt", "serialized_constants.pt"):
                raise UnsafeArchiveError(
                    f"{info.filename}: an archive of the pre-PT2 format is pickled: refused"
                )
        self.max_uncompressed_bytes = max_uncompressed_bytes
        self.materialized = 0  # bytes of zero-filled tensors created for empty payloads
        total = 0
        self._records: dict[str, zipfile.ZipInfo] = {}
        root: str | None = None
        for info in infos:
            _check_member_name(info.filename)
            if info.flag_bits & 0x1:
                raise ArchiveError(f"archive member {info.filename!r} is encrypted")
            total += info.file_size
            if max_uncompressed_bytes is not None and total > max_uncompressed_bytes:
                raise ArchiveError(
                    f"the archive's members declare more than {max_uncompressed_bytes} "
                    "uncompressed bytes"
                )
            if info.is_dir():
                continue
            top, sep, rest = info.filename.partition("/")
            if not sep or not rest:
                raise ArchiveError(
                    f"archive member {info.filename!r} is not inside the archive's root folder"
                )
            if root is None:
                root = top
            elif top != root:
                raise ArchiveError(
                    f"archive member {info.filename!r} is outside the root folder {root!r}"
                )
            if rest in self._records:
                raise ArchiveError(f"archive member {info.filename!r} appears twice")
            self._records[rest] = info
        self.archive_file = self  # what torch's helpers call the record reader

    def get_file_names(self) -> list[str]:
        return list(self._records)

    def has(self, name: str) -> bool:
        return name in self._records

    def get_record_size(self, name: str) -> int:
        info = self._records.get(name)
        if info is None:
            raise ArchiveError(f"{name} is missing from the archive")
        return info.file_size

    def read_bytes(self, name: str) -> bytes:
        info = self._records.get(name)
        if info is None:
            raise ArchiveError(f"{name} is missing from the archive")
        try:
            with self._zip.open(info) as f:
                data = f.read(info.file_size + 1)
        except (
            zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, ValueError
        ) as e:
            raise ArchiveError(f"{name} cannot be read: {e}") from None
        if len(data) != info.file_size:
            raise ArchiveError(f"{name} does not hold the {info.file_size} bytes it declares")
        return data

    def read_string(self, name: str) -> str:
        try:
            return self.read_bytes(name).decode()
        except UnicodeDecodeError:
            raise ArchiveError(f"{name} is not UTF-8 text") from None

    def get_storage_from_record(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The payload as a flat tensor of ``numel`` elements of ``dtype``: a copy of the bytes
        in memory torch owns (the bytearray is kept alive by the tensor)."""
        raw = bytearray(self.read_bytes(name))
        if numel * torch._utils._element_size(dtype) != len(raw):
            raise ArchiveError(f"{name}: {len(raw)} bytes is not {numel} elements of {dtype}")
        return torch.frombuffer(raw, dtype=dtype)

    def as_torch_reader(self) -> PT2ArchiveReader:
        """This archive, typed as what torch's helpers take (they only use the methods above)."""
        return cast(PT2ArchiveReader, self)


# --------------------------------------------------------------------------------------------
# Checking the program JSON


_IDENTIFIER_FIELDS = frozenset(
    ["name", "as_name", "user_input_name"]  # graph names: placeholders, nodes, kwargs, subgraphs
)
_FQN_FIELDS = frozenset(
    ["parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn"]
)
_GRAPH_NAME_MAPS = frozenset(
    ["tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values"]
)

# A symbolic expression is written by sympy's srepr (``Add(Mul(Integer(2), Symbol('s0',
# positive=True, integer=True)), Integer(1))``) and read back by ``sympy.sympify``, i.e. eval.
# It may only use: the classes and functions srepr and torch's deserializer name, sympy's
# assumption keywords, numbers, bare symbol names (s0, u3, zf1, ...: torch's prefixes), and a
# string literal only as the first argument of Symbol (a symbol name) or Float (a decimal).
# Anything else (builtins, sympy's `test` or `preview`, attribute access, subscripts, lambdas,
# other strings, which sympify parses as more code) is refused.
_SYMBOL = re.compile(
    "^(?:"
    + "|".join(
        sorted((re.escape(p) for p in prefix_str.values()), key=len, reverse=True)
    )
    + r")[0-9]+$"
)
_FLOAT_TEXT = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|inf|nan)$")
_EXPR_NAMES = frozenset(
    [
        # torch.utils._sympy.functions, as GraphModuleDeserializer.sympy_functions lists them
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
        "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "int_oo",
        "IntInfinity", "NegativeIntInfinity",
        # sympy classes srepr writes
        "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Abs", "floor",
        "ceiling", "sqrt", "exp", "log", "sign", "Equality", "Unequality", "GreaterThan",
        "StrictGreaterThan", "LessThan", "StrictLessThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
        "And", "Or", "Not", "Xor", "Piecewise", "ExprCondPair", "ITE", "Tuple", "oo", "zoo",
        "nan", "true", "false", "True", "False", "pi", "E", "Infinity", "NegativeInfinity",
        "NaN", "ComplexInfinity", "Half", "One", "Zero", "NegativeOne",
        # keyword arguments
        "precision", "algebraic", "antihermitian", "commutative", "complex", "composite",
        "even", "extended_negative", "extended_nonnegative", "extended_nonpositive",
        "extended_nonzero", "extended_positive", "extended_real", "finite", "hermitian",
        "imaginary", "infinite", "integer", "irrational", "negative", "noninteger",
        "nonnegative", "nonpositive", "nonzero", "odd", "polar", "positive", "prime",
        "rational", "real", "transcendental", "zero",
    ]
)
_EXPR_GENERATED_NAMES = re.compile(r"^(?:OpaqueUnaryFn|BitwiseFn)_[a-z0-9_]+$")
_EXPR_OPERATORS = frozenset(
    ["+", "-", "*", "/", "//", "%", "**", "(", ")", ",", "<", ">", "<=", ">=", "==", "!=",
     "&", "|", "~", "="]
)
_STRING_LITERAL = re.compile(r"""^(['"])([^'"\\]*)\1$""")
_MAX_EXPR_CHARS = 100_000


def _check_expr(expr: str) -> None:
    """A symbolic expression must be sympy arithmetic over symbols: ``sympy.sympify`` evals it."""
    if len(expr) > _MAX_EXPR_CHARS or "\n" in expr or "\r" in expr:
        raise ArchiveError(f"symbolic expression {expr[:200]!r} is refused")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(expr).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise ArchiveError(f"symbolic expression {expr[:200]!r} is refused: {e}") from None
    before: list[str] = ["", ""]  # the two previous significant tokens
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            continue
        text = tok.string
        if tok.type == tokenize.NUMBER:
            ok = not re.search("[jJxXoObB_]", text)
        elif tok.type == tokenize.NAME:
            ok = text in _EXPR_NAMES or bool(
                _SYMBOL.match(text) or _EXPR_GENERATED_NAMES.match(text)
            )
        elif tok.type == tokenize.OP:
            ok = text in _EXPR_OPERATORS
        elif tok.type == tokenize.STRING:
            literal = _STRING_LITERAL.match(text)
            content = literal.group(2) if literal else ""
            ok = before[1] == "(" and (
                (before[0] == "Symbol" and bool(_SYMBOL.match(content)))
                or (before[0] == "Float" and bool(_FLOAT_TEXT.match(content)))
            )
        else:
            ok = False
        if not ok:
            raise ArchiveError(
                f"symbolic expression {expr[:200]!r} is refused: {text[:50]!r} is not sympy "
                "arithmetic over symbols"
            )
        before = [before[1], text]


def _check_identifier(value: str, what: str) -> None:
    """A name FX writes into code. Empty is allowed (positional arguments of higher-order
    operators have no name) and is no code."""
    if value and not value.isidentifier():
        raise ArchiveError(f"{what} {value[:200]!r} is not a Python identifier")


_FQN_PART = re.compile(r"""^[^"'\\]+$""")


def _check_fqn(value: str, what: str) -> None:
    """An attribute path: FX writes its non-identifier parts into ``getattr(x, "...")``."""
    if value == "" and what == "fqn":
        return
    for part in value.split("."):
        if not part or not part.isprintable() or not _FQN_PART.match(part):
            raise ArchiveError(f"{what} {value[:200]!r} is not an attribute path")


_DEFAULT_FACTORIES = frozenset(
    ["list", "dict", "set", "frozenset", "tuple", "int", "float", "bool", "str", "bytes"]
)


def _has_enum(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "__enum__" in v:
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _check_treespec(value: str, field: str) -> None:
    """A treespec (``in_spec``, ``out_spec``): torch's ``treespec_loads`` imports the modules
    it names (enum keys, ``defaultdict`` factories), so those are refused (but a builtin
    factory) before torch reads it. The keyword names of ``in_spec`` become code in
    ``module()``: they must not hold quotes or backslashes."""
    try:
        _protocol, root = json.loads(value)
    except (ValueError, TypeError):
        raise ArchiveError(f"{field} is not a serialized treespec") from None
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or not isinstance(node.get("children_spec"), list):
            raise ArchiveError(f"{field} is not a serialized treespec")
        context = node.get("context")
        if node.get("type") == "collections.defaultdict":
            if (
                not isinstance(context, dict)
                or context.get("default_factory_module") != "builtins"
                or context.get("default_factory_name") not in _DEFAULT_FACTORIES
            ):
                raise ArchiveError(
                    f"{field}: a defaultdict whose factory is not a builtin type is refused "
                    "(torch would import its module)"
                )
        elif isinstance(context, str):
            try:
                context = json.loads(context)
            except ValueError:
                raise ArchiveError(f"{field}: a treespec context is not JSON") from None
        if _has_enum(context):
            raise ArchiveError(
                f"{field}: enum keys are refused (torch would import the module they name)"
            )
        stack.extend(node["children_spec"])
    if field != "in_spec":
        return
    try:
        spec = pytree.treespec_loads(value)
    except Exception as e:
        raise ArchiveError(f"{field} cannot be read: {_short(e)}") from None
    specs = [spec]
    while specs:
        s = specs.pop()
        if s.type in (dict, OrderedDict, defaultdict):
            keys = s.context[1] if s.type is defaultdict else s.context
            for k in keys:
                if isinstance(k, str) and not (k.isprintable() and _FQN_PART.match(k)):
                    raise ArchiveError(f"{field} key {k[:200]!r} is refused")
        specs.extend(s.children_specs)


# guards_code: Python that ExportedProgram.module() execs (with builtins) when the program
# has example inputs. torch writes shape guards with ShapeGuardPythonPrinter, e.g.
# "L['x'].size()[0] == (1 + L['y'].size()[0])". Accepted: that language and no more.
_GUARD_NAMES = frozenset(
    ["L", "math", "max", "min", "abs", "int", "float", "True", "False", "None", "and", "or",
     "not", "if", "else", "inf"]
)
_GUARD_ATTRIBUTES = frozenset(
    ["size", "stride", "storage_offset", "floor", "ceil", "trunc", "sqrt", "exp", "log",
     "isnan", "isinf"]
)
_GUARD_OPERATORS = frozenset(
    ["+", "-", "*", "/", "//", "%", "(", ")", "[", "]", ",", "<", ">", "<=", ">=", "==", "!=",
     ".", "&", "|", "~"]
)
_KEY_TEXT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_guard(code: str) -> None:
    """A ``guards_code`` entry must be a shape guard: comparisons and arithmetic over input
    sizes, strides and offsets (``L['x'].size()[0]``). Anything else is refused."""
    def refuse(why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(
            f"guards_code entry {code[:200]!r} is Python that ExportedProgram.module() executes "
            f"and not a shape guard ({why}): refused"
        )

    if len(code) > _MAX_EXPR_CHARS or "\n" in code or "\r" in code:
        raise refuse("too long or several lines")
    try:
        tokens = [
            t for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)
        ]
    except (tokenize.TokenError, SyntaxError) as e:
        raise refuse(str(e)) from None
    for i, tok in enumerate(tokens):
        text = tok.string
        prev = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if tok.type == tokenize.NUMBER:
            ok = not re.search("[jJxXoObB_]", text)
        elif tok.type == tokenize.NAME:
            ok = text in _GUARD_ATTRIBUTES if prev == "." else text in _GUARD_NAMES
        elif tok.type == tokenize.OP:
            ok = text in _GUARD_OPERATORS
        elif tok.type == tokenize.STRING:
            literal = _STRING_LITERAL.match(text)
            ok = (
                prev == "[" and after == "]" and literal is not None
                and bool(_KEY_TEXT.match(literal.group(2)))
            )
        else:
            ok = False
        if not ok:
            raise refuse(f"{text[:50]!r}")


def _field_rule(field: str, value: Any) -> None:
    """The checks of one schema field, by name (the export schema names fields consistently)."""
    if field in _IDENTIFIER_FIELDS and isinstance(value, str):
        _check_identifier(value, field)
    elif field in _FQN_FIELDS and isinstance(value, str):
        _check_fqn(value, field)
    elif field == "expr_str":
        _check_expr(value)
    elif field == "as_operator":
        check_target(value)  # ProgramDecodeError, like a node target
    elif field == "forward_arg_names" and value is not None:
        for name in value:
            _check_identifier(name, "forward_arg_names entry")
    elif field in ("in_spec", "out_spec"):
        _check_treespec(value, field)
    elif field == "guards_code":
        for code in value:
            _check_guard(code)
    elif field in _GRAPH_NAME_MAPS:
        for key in value:
            _check_identifier(key, f"{field} key")


def _check_schema(obj: Any, hint: Any, where: str) -> None:
    """``obj`` (from ``_dict_to_dataclass``, which trusts the JSON's types) has the type the
    export schema declares, and every field passes :func:`_field_rule`."""
    hint = _resolve_schema_cls(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        _check_schema(obj, hint.__origin__, where)
        return
    if origin in (typing.Union, UnionType):
        args = typing.get_args(hint)
        if obj is None and NoneType in args:
            return
        rest = [a for a in args if a is not NoneType]
        if len(rest) != 1:
            raise ArchiveError(f"{where}: unsupported schema type {hint}")
        _check_schema(obj, rest[0], where)
        return
    if isinstance(hint, type) and issubclass(hint, _Union):
        if not isinstance(obj, hint):
            raise ArchiveError(f"{where}: expected {hint.__name__}")
        hints = typing.get_type_hints(hint, globalns=vars(schema), include_extras=True)
        tag = str(obj.type)  # a _UnionTag refuses comparisons with other tags
        if tag not in hints or tag.startswith("_"):
            raise ArchiveError(f"{where}: {hint.__name__} has no member {tag!r}")
        _check_schema(obj.value, hints[tag], f"{where}.{tag}")
        _field_rule(tag, obj.value)
        return
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(obj, hint):
            raise ArchiveError(f"{where}: expected {hint.__name__}")
        hints = typing.get_type_hints(hint, globalns=vars(schema), include_extras=True)
        for f in dataclasses.fields(hint):
            value = getattr(obj, f.name)
            _check_schema(value, hints[f.name], f"{where}.{f.name}")
            _field_rule(f.name, value)
        return
    if origin is list:
        if not isinstance(obj, list):
            raise ArchiveError(f"{where}: expected a list")
        (item,) = typing.get_args(hint)
        for i, v in enumerate(obj):
            _check_schema(v, item, f"{where}[{i}]")
        return
    if origin is dict:
        if not isinstance(obj, dict):
            raise ArchiveError(f"{where}: expected an object")
        key, item = typing.get_args(hint)
        for k, v in obj.items():
            _check_schema(k, key, f"{where} key")
            _check_schema(v, item, f"{where}[{k!r}]")
        return
    if hint is bool:
        ok = type(obj) is bool
    elif hint is int:
        ok = type(obj) is int
    elif hint is float:
        ok = type(obj) is float
    elif hint is str:
        ok = type(obj) is str
    elif isinstance(hint, type) and issubclass(hint, Enum):
        try:
            hint(obj)
            ok = type(obj) is int or isinstance(obj, hint)
        except ValueError:
            ok = False
    else:
        raise ArchiveError(f"{where}: unsupported schema type {hint}")
    if not ok:
        raise ArchiveError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {obj!r:.80}")


def _read_dataclass(cls: type, value: Any, where: str) -> Any:
    """``_dict_to_dataclass`` (torch's JSON reader), then :func:`_check_schema`."""
    try:
        obj = _dict_to_dataclass(cls, value)
    except (ArchiveError, ProgramDecodeError):
        raise
    except Exception as e:
        raise ArchiveError(f"{where} does not match the export schema: {_short(e)}") from None
    _check_schema(obj, cls, where)
    return obj


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 500 else text[:500] + "..."


# --------------------------------------------------------------------------------------------
# Weights and constants


def _plain_name(path_name: str, where: str) -> None:
    if not path_name or "/" in path_name or "\\" in path_name or path_name in (".", ".."):
        raise ArchiveError(f"{where}: payload name {path_name[:200]!r} is refused")


def _int_list(values: list[schema.SymInt], what: str, where: str) -> list[int]:
    out = []
    for v in values:
        if v.type != "as_int" or type(v.value) is not int or v.value < 0:
            raise ArchiveError(f"{where}: {what} must be non-negative integers")
        out.append(v.value)
    return out


def _load_payloads(
    archive: _MemoryArchive, config_file: str, base_dir: str, constants: bool
) -> dict[str, torch.Tensor]:
    """The tensors a weights or constants config describes, as torch's ``_load_state_dict`` /
    ``_load_constants`` build them (one flat buffer per payload file, an ``as_strided`` view per
    FQN, ``Parameter`` where ``is_param``), every view checked against its payload first."""
    if not archive.has(config_file):
        raise ArchiveError(f"{config_file} is missing from the archive")
    try:
        config = _load_payload_config(archive.as_torch_reader(), config_file)
    except (ArchiveError, UnsafeArchiveError):
        raise
    except Exception as e:
        raise ArchiveError(f"{config_file} cannot be read: {_short(e)}") from None
    _check_schema(config, schema.PayloadConfig, config_file)

    for fqn, meta in config.config.items():
        where = f"{config_file}: {fqn!r}"
        _check_fqn(fqn, "payload FQN")
        _plain_name(meta.path_name, where)
        record = base_dir + meta.path_name
        if constants and meta.path_name.startswith(pt2c.CUSTOM_OBJ_FILENAME_PREFIX):
            raise UnsafeArchiveError(
                f"{record} ({fqn!r}) is a pickled TorchScript custom object: refused"
            )
        if constants and meta.path_name.startswith(pt2c.OPAQUE_OBJ_FILENAME_PREFIX):
            raise UnsafeArchiveError(f"{record} ({fqn!r}) is a pickled opaque object: refused")
        if constants and not meta.path_name.startswith(pt2c.TENSOR_CONSTANT_FILENAME_PREFIX):
            raise ArchiveError(f"{where}: unsupported constant payload {meta.path_name!r}")
        if meta.use_pickle:
            raise UnsafeArchiveError(
                f"{record} ({fqn!r}) is a pickled tensor (use_pickle): refused"
            )
        tm = meta.tensor_meta
        if tm is None:
            raise ArchiveError(f"{where}: no tensor_meta")
        try:
            dtype = deserialize_scalar_type(tm.dtype)
        except KeyError:
            raise ArchiveError(f"{where}: unknown dtype {tm.dtype!r}") from None
        sizes = _int_list(tm.sizes, "sizes", where)
        strides = _int_list(tm.strides, "strides", where)
        (offset,) = _int_list([tm.storage_offset], "storage_offset", where)
        if len(sizes) != len(strides):
            raise ArchiveError(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
        nbytes = archive.get_record_size(record)
        if nbytes == 0:  # torch materializes zeros of the declared size
            need = math.prod(sizes) * torch._utils._element_size(dtype)
            archive.materialized += need
            limit = archive.max_uncompressed_bytes
            if limit is not None and archive.materialized > limit:
                raise ArchiveError(
                    f"{where}: an empty payload would be filled with {need} zero bytes, "
                    f"more than the limit of {limit}"
                )

    try:
        file_map = _build_file_map(archive.as_torch_reader(), config, base_dir)
    except (ArchiveError, UnsafeArchiveError):
        raise
    except Exception as e:  # e.g. a size not a multiple of the element size, a device
        raise ArchiveError(f"{config_file}: payloads cannot be built: {_short(e)}") from None

    out: dict[str, torch.Tensor] = {}
    for fqn, meta in config.config.items():
        where = f"{config_file}: {fqn!r}"
        tm = meta.tensor_meta
        assert tm is not None
        flat = file_map[meta.path_name]
        if deserialize_scalar_type(tm.dtype) != flat.dtype:
            raise ArchiveError(
                f"{where}: dtype {deserialize_scalar_type(tm.dtype)} differs from the "
                f"{flat.dtype} of its payload {meta.path_name!r}"
            )
        size = deserialize_size(tm.sizes)
        stride = deserialize_stride(tm.strides)
        offset = deserialize_storage_offset(tm.storage_offset)
        if all(s > 0 for s in size):
            last = offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True))
            if last >= flat.numel():
                raise ArchiveError(
                    f"{where}: sizes {list(size)}, strides {list(stride)} and offset {offset} "
                    f"reach element {last}, beyond the {flat.numel()} elements of "
                    f"{base_dir}{meta.path_name}"
                )
        try:
            tensor = torch.as_strided(flat, size=size, stride=stride, storage_offset=offset)
            if meta.is_param:
                tensor = torch.nn.Parameter(tensor, requires_grad=tm.requires_grad)
        except RuntimeError as e:
            raise ArchiveError(f"{where}: {_short(e)}") from None
        out[fqn] = tensor
    return out


# --------------------------------------------------------------------------------------------
# Programs

# torch's deserializer keeps its state in a module global (_CURRENT_DESERIALIZER) and refuses
# to run twice at once: serialize deserializations in this process.
_DESERIALIZE_LOCK = threading.Lock()


def _read_program(archive: _MemoryArchive, model_name: str, file: str) -> ExportedProgram:
    for legacy in (f"{pt2c.WEIGHTS_DIR}{model_name}.pt", f"{pt2c.CONSTANTS_DIR}{model_name}.pt"):
        if archive.has(legacy):
            raise UnsafeArchiveError(f"{legacy} holds legacy pickled tensors: refused")
    try:
        value = checked_graph_json(archive.read_bytes(file))
    except ProgramDecodeError as e:
        raise ArchiveError(f"{file}: {e}") from e
    try:
        serialized: schema.ExportedProgram = _read_dataclass(schema.ExportedProgram, value, file)
    except ProgramDecodeError as e:
        raise ArchiveError(f"{file}: {e}") from e
    state_dict = _load_payloads(
        archive, pt2c.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model_name), pt2c.WEIGHTS_DIR, False
    )
    constants = _load_payloads(
        archive,
        pt2c.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model_name),
        pt2c.CONSTANTS_DIR,
        True,
    )
    try:
        with _DESERIALIZE_LOCK:
            return ExportedProgramDeserializer().deserialize(
                serialized, state_dict, constants, None  # type: ignore[arg-type]
            )
    except Exception as e:
        raise ArchiveError(f"{file} cannot be deserialized: {_short(e)}") from e


def read_pt2(
    data: bytes | memoryview,
    *,
    max_members: int = 100_000,
    max_uncompressed_bytes: int | None = None,
) -> dict[str, ExportedProgram]:
    """The exported programs of a PT2 archive, by model name, read without running anything
    the archive holds.

    ``data`` is an archive written by ``torch.export.save`` (one program, named ``"model"``) or
    by ``torch.export.pt2_archive._package.package_pt2`` (several). Each program is the one
    ``torch.export.load`` would return (same graph, signature, state_dict and constants, with
    ``Parameter``s, ``requires_grad`` and storage sharing as torch builds them, range
    constraints, module call graph, verifiers), except that ``example_inputs`` is None: the
    sample inputs are pickles and are never read. Other members (extra files, AOTInductor or
    ExecuTorch artifacts) are ignored.

    Limits: at most ``max_members`` members; if ``max_uncompressed_bytes`` is given, the
    members' declared uncompressed sizes (checked before anything is read) plus the zeros torch
    would materialize for empty payloads must not exceed it. ``None``: no byte limit.

    Raises :class:`UnsafeArchiveError` if reading would need unpickling (``use_pickle``
    weights or constants, custom or opaque objects, legacy ``.pt`` weights, a pre-PT2 archive)
    or the program carries ``guards_code``; :class:`ArchiveError` for anything else unreadable,
    including a program whose graph names something that is not a registered operator (the
    codec's ``ProgramDecodeError`` is the ``__cause__``) or holds a name or symbolic expression
    that torch would turn into code. Nothing is extracted to disk.
    """
    archive = _MemoryArchive(data, max_members, max_uncompressed_bytes)
    names = archive.get_file_names()
    if not archive.has(pt2c.ARCHIVE_FORMAT_PATH):
        raise ArchiveError(f"not a PT2 archive: {pt2c.ARCHIVE_FORMAT_PATH} is missing")
    if archive.read_bytes(pt2c.ARCHIVE_FORMAT_PATH).decode(errors="replace") != (
        pt2c.ARCHIVE_FORMAT_VALUE
    ):
        raise ArchiveError(f"not a PT2 archive: {pt2c.ARCHIVE_FORMAT_PATH} is not 'pt2'")
    if not archive.has(pt2c.ARCHIVE_VERSION_PATH):
        raise ArchiveError(f"{pt2c.ARCHIVE_VERSION_PATH} is missing")
    version = archive.read_bytes(pt2c.ARCHIVE_VERSION_PATH).decode(errors="replace")
    if version != pt2c.ARCHIVE_VERSION_VALUE:
        raise ArchiveError(
            f"archive version {version[:20]!r} is not {pt2c.ARCHIVE_VERSION_VALUE!r}"
        )
    if archive.has("byteorder"):
        order = archive.read_bytes("byteorder").decode(errors="replace")
        if order != sys.byteorder:
            raise ArchiveError(f"the archive is {order[:20]!r}-endian, this host {sys.byteorder}")

    prefix, suffix = pt2c.MODELS_FILENAME_FORMAT.split("{}")
    programs: dict[str, ExportedProgram] = {}
    for file in names:
        if not file.startswith(pt2c.MODELS_DIR):
            continue
        if not (file.startswith(prefix) and file.endswith(suffix)) or len(file) <= len(
            prefix + suffix
        ):
            raise ArchiveError(f"{file} is not a program file ({pt2c.MODELS_FILENAME_FORMAT})")
        model_name = file[len(prefix) : -len(suffix)]
        programs[model_name] = _read_program(archive, model_name, file)
    if not programs:
        raise ArchiveError("the archive holds no exported program")
    return programs
