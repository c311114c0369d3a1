"""Reading PT2 archives (``torch.export.save``, ``package_pt2``) without running their content.

``torch.export.load`` unpickles: the sample inputs always, weights and constants saved with
``use_pickle`` (tensor subclasses), custom and opaque objects, legacy ``.pt`` weights. And the
program JSON makes torch run code or import modules with no pickle in sight:

* symbolic sizes (``SymExpr.expr_str``) go to ``sympy.sympify``, which ``eval``s them;
* graph input names become parameters of the ``def forward(...)`` FX generates and ``exec``s
  while deserializing (``"x=__import__('os').system(...)"`` runs);
* ``in_spec``/``out_spec`` treespecs name modules that ``treespec_loads`` imports (enum keys,
  ``defaultdict`` factories);
* ``guards_code`` is Python that ``ExportedProgram.module()`` ``exec``s (with example inputs);
* attribute paths, ``forward_arg_names`` and ``in_spec`` keyword names are written into code
  that FX and ``module()`` generate; ``as_operator`` arguments resolve any attribute of
  ``torch``, ``operator`` or ``math``.

:func:`read_pt2` reads the same format with none of that: the zip is read in memory with
:mod:`zipfile` (names, member count and declared sizes checked first), no pickle is ever loaded
(sample inputs are not read at all), and the program JSON is checked before torch's
deserializer sees it: node targets by :func:`remote_partitioner.proto.codec.checked_graph_json`,
``as_operator`` by the codec's ``check_target``, and here every field's type against the export
schema (torch's JSON reader trusts the JSON's types: a list where a string is expected reaches
``sympify`` as a list of strings), graph names (identifiers), attribute paths (no quotes or
backslashes), symbolic expressions (sympy's ``srepr`` language over torch's symbols), treespecs
(no imports) and ``guards_code`` (shape guards only). What it reads comes back as the
``ExportedProgram`` that ``torch.export.load`` gives, except that ``example_inputs`` is None.

Torch's own pieces are used wherever they do not unpickle: the archive layout constants
(``torch.export.pt2_archive.constants``), the payload config reader (``_load_payload_config``),
the flat payload builder (``_build_file_map``), the export schema and its JSON reader
(``_dict_to_dataclass``), and ``ExportedProgramDeserializer``. The zip reader is ours: torch's
``PT2ArchiveReader`` (C++ ``PyTorchFileReader``) can read from a buffer, but offers no way to
check names or declared sizes before it reads; ours presents the part of its interface those
functions use. Re-implemented: ``_load_state_dict``/``_load_constants``/
``_load_exported_programs``, the parts that call ``torch.load``, ``pickle.loads`` or
``torch._C._pickle_load_obj``, with every strided view checked against its payload first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import math
import re
import struct
import sys
import threading
import typing
import zipfile
from enum import Enum
from types import NoneType, UnionType
from typing import Any, cast

import torch
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

from remote_partitioner.proto.codec import ProgramDecodeError, checked_graph_json
from remote_partitioner.proto.graph_check import UnsafeGraphError, check_fqn, field_rule

__all__ = ["ArchiveError", "UnsafeArchiveError", "read_pt2"]


class UnsafeArchiveError(ValueError):
    """The archive can only be read by running something it holds: a pickle (weights or
    constants saved with ``use_pickle``, custom objects, opaque objects, legacy ``.pt`` weights
    or an archive of the pre-PT2 format) or Python that torch would execute (a ``guards_code``
    entry that is not a shape guard). The message names the archive member or field, and why."""


class ArchiveError(ValueError):
    """The archive is not a readable PT2 archive: not a zip, a refused member name, too many or
    too large members, missing files, a malformed config or program, a tensor that does not fit
    in its payload, an unknown dtype, a program that names something other than an operator
    (the :class:`~remote_partitioner.proto.codec.ProgramDecodeError` is the ``__cause__``), or
    a name, symbolic expression or treespec that torch would turn into code or imports."""


# --------------------------------------------------------------------------------------------
# The zip, in memory

#: A zip member's local header: signature, version, flags, method, time, date, CRC-32,
#: compressed and uncompressed sizes, name length, extra field length.
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_HEADER_MAGIC = b"PK\x03\x04"
#: Payloads shared with the archive's memory start at a multiple of this (torch's own
#: allocations' alignment; ``torch.export.save`` aligns its members to it).
_ALIGNMENT = 64


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a byte view, for :mod:`zipfile` (``io.BytesIO`` would
    copy a memoryview whole)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._view.nbytes}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._view.nbytes if size is None or size < 0 else self._pos + size
        out = bytes(self._view[self._pos : end])
        self._pos += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        piece = self._view[self._pos : self._pos + target.nbytes]
        target[: piece.nbytes] = piece
        self._pos += piece.nbytes
        return piece.nbytes


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
        view = memoryview(data)
        self._view = view if view.format == "B" and view.c_contiguous else view.cast("B")
        try:
            self._zip = zipfile.ZipFile(_ViewFile(self._view))
            infos = self._zip.infolist()
        except Exception as e:  # BadZipFile, but also struct, Unicode, OS errors
            raise ArchiveError(f"not a zip archive: {_short(e)}") from None
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
        except Exception as e:  # BadZipFile, zlib.error, EOFError, unsupported compression
            raise ArchiveError(f"{name} cannot be read: {_short(e)}") from None
        if len(data) != info.file_size:
            raise ArchiveError(f"{name} does not hold the {info.file_size} bytes it declares")
        return data

    def read_string(self, name: str) -> str:
        try:
            return self.read_bytes(name).decode()
        except UnicodeDecodeError:
            raise ArchiveError(f"{name} is not UTF-8 text") from None

    def get_storage_from_record(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The payload as a flat tensor of ``numel`` elements of ``dtype``.

        A stored (uncompressed) member is taken from the archive's memory as it lies there:
        shared with it when the archive's memory is writable (the caller gave it over, see
        :func:`read_pt2`) and the payload starts where torch aligns its allocations, else
        copied once into memory torch allocates. Any other member is read through
        :mod:`zipfile` and copied. Like torch's reader, a stored member's CRC-32 is not
        checked (the archive's SHA-256 names its bytes).
        """
        info = self._records.get(name)
        if info is None:
            raise ArchiveError(f"{name} is missing from the archive")
        nbytes = numel * torch._utils._element_size(dtype)
        if nbytes != info.file_size:
            raise ArchiveError(
                f"{name}: {info.file_size} bytes is not {numel} elements of {dtype}"
            )
        payload = self._stored_payload(info)
        if payload is None:
            raw = self.read_bytes(name)
            flat = torch.empty(numel, dtype=dtype)
            if raw:
                ctypes.memmove(flat.data_ptr(), raw, len(raw))  # read_bytes checked the size
            return flat
        if not payload.readonly and nbytes:
            shared = torch.frombuffer(payload, dtype=dtype, count=numel)
            if shared.data_ptr() % _ALIGNMENT == 0:
                return shared
        flat = torch.empty(numel, dtype=dtype)
        if nbytes:
            target = (ctypes.c_ubyte * nbytes).from_address(flat.data_ptr())
            memoryview(target).cast("B")[:] = payload  # one memcpy; sizes checked above
        return flat

    def _stored_payload(self, info: zipfile.ZipInfo) -> memoryview | None:
        """The bytes of a stored, unencrypted member, as a slice of the archive's memory;
        None for any other member, or when its local header does not agree with the zip
        directory (reading it through :mod:`zipfile` then says what is wrong)."""
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            return None
        view, start = self._view, info.header_offset
        if start < 0:
            return None
        header = view[start : start + _LOCAL_HEADER.size]
        if header.nbytes != _LOCAL_HEADER.size:
            return None
        fields = _LOCAL_HEADER.unpack(header)
        if fields[0] != _LOCAL_HEADER_MAGIC or fields[2] & 0x1:
            return None
        name_len, extra_len = fields[-2], fields[-1]
        name_at = start + _LOCAL_HEADER.size
        encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
        if bytes(view[name_at : name_at + name_len]) != info.orig_filename.encode(encoding):
            return None
        begin = name_at + name_len + extra_len
        end = begin + info.file_size
        if end > view.nbytes:
            return None
        return view[begin:end]

    def as_torch_reader(self) -> PT2ArchiveReader:
        """This archive, typed as what torch's helpers take (they only use the methods above)."""
        return cast(PT2ArchiveReader, self)


# --------------------------------------------------------------------------------------------
# Checking the program JSON


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The schema class's field types (cached: get_type_hints is slow)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(
            cls, globalns=vars(schema), include_extras=True
        )
    return hints


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
        hints = _hints(hint)
        tag = str(obj.type)  # a _UnionTag refuses comparisons with other tags
        if tag not in hints or tag.startswith("_"):
            raise ArchiveError(f"{where}: {hint.__name__} has no member {tag!r}")
        _check_schema(obj.value, hints[tag], f"{where}.{tag}")
        field_rule(tag, obj.value)
        return
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(obj, hint):
            raise ArchiveError(f"{where}: expected {hint.__name__}")
        hints = _hints(hint)
        for f in dataclasses.fields(hint):
            value = getattr(obj, f.name)
            _check_schema(value, hints[f.name], f"{where}.{f.name}")
            field_rule(f.name, value)
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
        try:
            check_fqn(fqn, "payload FQN")
        except ProgramDecodeError as e:
            raise ArchiveError(str(e)) from None
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
        serialized: schema.ExportedProgram = _read_dataclass(schema.ExportedProgram, value, file)
    except UnsafeGraphError as e:
        raise UnsafeArchiveError(f"{file}: {e}") from e
    except ProgramDecodeError as e:
        raise ArchiveError(f"{file}: {e}") from e
    except RecursionError:
        raise ArchiveError(f"{file} is nested too deeply") from None
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

    Memory: the tensors of a stored payload (what ``torch.export.save`` writes) share a
    writable ``data``'s memory rather than copy it, as the blob store's private copy-on-write
    mappings allow: the caller gives a writable ``data`` over and must not change it afterwards
    (a ``bytearray`` cannot be resized while they live). A read-only ``data`` (``bytes``) is
    copied, once per payload.

    Limits: at most ``max_members`` members; if ``max_uncompressed_bytes`` is given, the
    members' declared uncompressed sizes (checked before anything is read) plus the zeros torch
    would materialize for empty payloads must not exceed it. ``None``: no byte limit.

    Stricter than torch: a byte order other than this host's, payload aliases that disagree on
    dtype (torch silently gives them the payload's), and anything in the program JSON that
    torch would turn into code or imports are refused (see the module docstring).

    Raises :class:`UnsafeArchiveError` if reading would need unpickling (``use_pickle``
    weights or constants, custom or opaque objects, legacy ``.pt`` weights, a pre-PT2 archive)
    or the program's ``guards_code`` holds more than shape guards; :class:`ArchiveError` for
    anything else unreadable, including a graph that names something that is not a registered
    operator (ProgramDecodeError is wrapped: the codec's ``ProgramDecodeError`` is the
    ``__cause__``). Nothing is extracted to disk; torch's deserializer runs under a module lock
    (it keeps its state in a global and refuses concurrent use).
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
