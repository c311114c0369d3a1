"""ExecuTorch's backend conformance suite, each test run with a flow and its remote twin.

ExecuTorch ships its backend test suite in the wheel (``executorch/backends/test/suite``:
operator tests under ``operators/``, model tests under ``models/``, parametrized by the flows
of ``flow.py``). This script runs it with pytest for the flows whose partitioner the server
hosts (XNNPACK's four, Core ML's two, Vulkan's two, WebGPU's; OpenVINO's two in its
environment) and, inside every test, lowers each model twice: with the flow as it is, and with
its *remote twin*, the same flow whose partitioners are replaced by ``RemotePartitioner`` for
the same partitioner and options, against one real server this script starts (or ``--server``).
Both runs are seeded identically (the suite's seed of the test's name, with ``--seed`` as the
run seed), and run with Python's string hash seed the server runs with: started without
``PYTHONHASHSEED``, the runner restarts itself with ``PYTHONHASHSEED=0``, as ``serve`` does
(Arm's partitioner orders its partitions by it, docs/environments.md). A test is *identical*
when both runs have the same outcome, the same ``.pte`` bytes (Core ML normalized for what two
local Core ML lowerings differ in: fresh UUIDs and the order of the mlpackage manifest's
entries) and leave the same random generator state after lowering.
Each Core ML lowering starts from coremltools' fresh conversion state (its name counters
survive a conversion that raised). With ``--remote-quantizer`` the twin's quantize stage runs a
``RemoteQuantizer`` too, for the hosted quantizer and spec that rebuild the flow's own
quantizer object (:func:`quantizer_spec`); only the flows with a quantize stage
(:data:`QUANTIZING_FLOWS`) can run so.

Usage::

    python scripts/conformance.py                        # every hosted flow, operators + models
    python scripts/conformance.py --flows xnnpack coreml -k "test_add or test_lstm"
    python scripts/conformance.py --suite operators --json build/conformance.json
    python scripts/conformance.py --remote-preprocess --flows vulkan   # preprocess on the server
    python scripts/conformance.py --remote-quantizer --suite operators  # quantizers remote too
    python scripts/conformance.py --jobs 2 --resume      # two processes, one server, one log

It prints pytest's progress, then a table per flow (tests, identical, differing, failing remote
only) and writes every comparison to the JSON file. Exit status 0 when every test is identical.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import functools
import gc
import hashlib
import importlib.util
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from remote_partitioner.server.pattern_memo import (
    memoize_coreml_pattern_graphs,
    memoize_vulkan_pattern_graphs,
    memoize_xnnpack_pattern_graphs,
)

#: The flows whose partitioners the server hosts.
HOSTED_FLOWS = (
    "xnnpack", "xnnpack_static_int8_per_channel", "xnnpack_static_int8_per_tensor",
    "xnnpack_dynamic_int8_per_channel", "coreml", "coreml_static_int8", "vulkan",
    "vulkan_static_int8_per_channel", "webgpu",
)
#: The flows of the backends hosted by a server in an environment of their own (see
#: docs/environments.md), by environment: they are registered only where the backend imports,
#: so they run with that environment's Python (``make conformance-openvino``), never by default.
ENVIRONMENT_FLOWS: dict[str, tuple[str, ...]] = {
    "openvino": ("openvino", "openvino_int8"),
    "arm": ("arm_tosa_fp", "arm_tosa_int", "arm_ethos_u55", "arm_ethos_u85"),
}
#: The hosted flows with a quantize stage: the ones ``--remote-quantizer`` applies to.
QUANTIZING_FLOWS = (
    "xnnpack_static_int8_per_channel", "xnnpack_static_int8_per_tensor",
    "xnnpack_dynamic_int8_per_channel", "coreml_static_int8", "vulkan_static_int8_per_channel",
    "openvino_int8", "arm_tosa_int", "arm_ethos_u55", "arm_ethos_u85",
)
SUITES = ("operators", "models")
#: Appended to a flow's name in tables and logs when the twin quantizes with a
#: ``RemoteQuantizer`` (``--remote-quantizer``); it comes before :data:`SERVER_PREPROCESS_SUFFIX`.
REMOTE_QUANTIZER_SUFFIX = "+remote-quantizer"
#: Appended to a flow's name in tables and logs when the twin preprocesses on the server.
SERVER_PREPROCESS_SUFFIX = "+server-preprocess"
#: A test's timeout here, as a multiple of the suite's own (which is for one lowering, 120 s
#: for an operator test). The twin lowers twice, and on 2 busy cores a quantized LSTM test
#: took up to 940 s for both (xnnpack_static_int8_per_channel's test_lstm_seq_lengths).
TWIN_TIMEOUT_FACTOR = 10
#: What pytest-timeout's failure of a test says.
TIMEOUT_FAILURE = "from pytest-timeout"

_UUID = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_MANIFEST = re.compile(rb'\{\s*"fileFormatVersion"')


def normalize_coreml(pte: bytes, *, across_processes: bool = False) -> bytes:
    """``pte`` with what two local Core ML lowerings differ in made equal: each mlpackage
    manifest (the JSON object starting with ``{"fileFormatVersion"``) has its entries sorted
    by content and its root named by content, then every remaining UUID is zeroed. (Zeroing
    first would merge the manifest's keys.) The result is for comparison only.

    Then the operations coremltools names from its builder's counters (``const_N``,
    ``transpose_N``) are renumbered in order of first appearance (:func:`_renumber_counter_names`).
    Measured: four local lowerings of the suite's ``convnext_small`` in one process, each from
    coremltools' fresh state, gave four different programs that differ only in which of those
    operations got which number. coremltools' ``reduce_transposes`` pass visits the transposes
    it moves in the order of a ``set`` of operations (hashed by address), and names the
    transposes and constants it creates as it goes.

    ``across_processes``: the two lowerings ran in different processes (the server's
    preprocess against the client's), so the Core ML model's protobuf maps are also put in one
    order (:func:`_sorted_entries`). Measured: two local lowerings in two processes differ in
    the order of those maps (the model's metadata, each MIL op's inputs and attributes; the
    protobuf runtime's map order is per process), and three local processes compare equal
    after this. Within one process the maps keep one order, so it is off by default: the
    conformance twins run in one process and are compared without it.
    """
    out, pos = bytearray(), 0
    decoder = json.JSONDecoder()
    for match in _MANIFEST.finditer(pte):
        if match.start() < pos:
            continue
        try:
            text = pte[match.start():].decode("latin-1")
            manifest, end = decoder.raw_decode(text)
        except ValueError:
            continue
        entries = manifest.get("itemInfoEntries", {})
        if not isinstance(entries, dict):
            continue
        root = entries.get(manifest.get("rootModelIdentifier"))
        canonical = {
            **{k: v for k, v in manifest.items() if k not in ("itemInfoEntries",
                                                              "rootModelIdentifier")},
            "itemInfoEntries": sorted(json.dumps(v, sort_keys=True) for v in entries.values()),
            "rootModelIdentifier": json.dumps(root, sort_keys=True),
        }
        out += pte[pos:match.start()] + json.dumps(canonical, sort_keys=True).encode()
        pos = match.start() + len(text[:end].encode("latin-1"))
    out += pte[pos:]
    zeroed = _UUID.sub(b"00000000-0000-0000-0000-000000000000", bytes(out))
    renumbered = _renumber_counter_names(zeroed)
    return _sorted_entries(renumbered) if across_processes else renumbered


#: OpenVINO's export format, what ExecuTorch's ``OpenvinoBackend`` preprocess returns (OpenVINO's
#: ``ov::pass::StreamSerialize``): six little-endian uint64s (offset and size of the custom data,
#: the constants and the model), then those parts, starting with the custom data's XML; the model
#: is its IR XML, XOR-masked with OpenVINO's fixed ``codec_xor`` key (the CPU plugin's export).
_OV_HEADER = struct.Struct("<6Q")
_OV_CUSTOM_XML = b'<?xml version="1.0"?>\n<cnndata>'
_OV_XOR_KEY = bytes((0x30, 0x60, 0x70, 0x02, 0x04, 0x08, 0x3F, 0x6F, 0x72, 0x74, 0x78, 0x7F))
#: The names OpenVINO makes from its process-wide instance counter: a node's default name
#: ``TYPE_N`` (``Constant_4994``, ``Result_61``) and a model's ``ModelN``. ExecuTorch's and the
#: frontend's names (``aten_addmm_default``, ``arg_0``) are lower-case and left as they are.
_OV_AUTO_NAME = re.compile(rb"(?<![\w.])(Model|[A-Z][A-Za-z0-9]*_)([0-9]+)(?![\w])")


def _ov_mask(data: bytes) -> bytes:
    key = _OV_XOR_KEY * (len(data) // len(_OV_XOR_KEY) + 1)
    return (int.from_bytes(data, "little") ^ int.from_bytes(key[:len(data)], "little")).to_bytes(
        len(data), "little")


def normalize_openvino_blob(blob: bytes) -> bytes:
    """An OpenVINO export (``blob``) with the names OpenVINO numbers from its process-wide
    instance counter renumbered in order of first appearance (one numbering: the counter is
    shared by every node type), its model size updated; any other bytes as they are, and
    ``blob`` itself when it is not such an export. For comparison only.

    Measured: four lowerings of one model in one process gave four byte strings (``Model0``,
    ``Constant_3`` ... then ``Model4``, ``Constant_4994`` ...; the counter grows with every
    OpenVINO node the process creates and cannot be reset), equal after this; the first
    lowering of two fresh processes is equal as it is."""
    if len(blob) < _OV_HEADER.size or blob[_OV_HEADER.size:].find(_OV_CUSTOM_XML) != 0:
        return blob
    custom_at, custom_size, consts_at, consts_size, model_at, model_size = (
        _OV_HEADER.unpack_from(blob))
    if custom_at != _OV_HEADER.size or model_at + model_size != len(blob):
        return blob
    xml = _ov_mask(blob[model_at:])
    if not xml.startswith(b"<?xml"):
        return blob
    numbers: dict[bytes, bytes] = {}
    for match in _OV_AUTO_NAME.finditer(xml):
        numbers.setdefault(match[2], str(len(numbers)).encode())
    renamed = _OV_AUTO_NAME.sub(lambda m: m[1] + numbers[m[2]], xml)
    header = _OV_HEADER.pack(custom_at, custom_size, consts_at, consts_size, model_at,
                             len(renamed))
    return header + blob[_OV_HEADER.size:model_at] + _ov_mask(renamed)


def normalize_openvino(pte: bytes) -> Any:
    """``pte`` as ExecuTorch's own deserializer reads it (``deserialize_pte_binary``: the
    program, its delegates' data inline, constants, named data), with every OpenVINO delegate
    blob normalized by :func:`normalize_openvino_blob`: two ``.pte`` files compare equal when
    everything the runtime reads is equal but OpenVINO's counter-made names. The file's layout
    (offsets, padding: functions of the parts' sizes, which the names change) is not compared.
    For comparison only."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    for plan in pte_file.program.execution_plan:
        for delegate in plan.delegates:
            if delegate.id != "OpenvinoBackend":
                continue
            index = delegate.processed.index
            data = pte_file.program.backend_delegate_data[index]
            pte_file.program.backend_delegate_data[index] = dataclasses.replace(
                data, data=normalize_openvino_blob(bytes(data.data)))
    return pte_file


#: Names of MIL operations coremltools' builder numbers from its counters (``Builder.name_count``)
#: in an order two local lowerings do not agree on (see :func:`normalize_coreml`): the families
#: measured to differ, and no other (ExecuTorch's node names, ``aten_conv2d_default_1``, are
#: left as they are: a difference there is the remote path's).
_COUNTER_NAMED = re.compile(rb"(const|transpose)_([0-9]+)(?![0-9])")
#: What may not come before a counter-named operation's name (it would be part of another
#: name). Checked by hand: a look-behind in the pattern makes the scan of a 100 MB .pte 4x slower.
_NAME_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _renumber_counter_names(data: bytes) -> bytes:
    """``data`` with each family of counter-named operations (``const_N``, ``transpose_N``)
    renumbered from its own numbers, in order of first appearance: two programs that differ
    only in which operation got which number become equal; programs with other numbers, or
    other operations, stay different. A name whose number changes its count of digits changes
    its length, and the protobuf lengths around it are not rewritten, so such a pair may still
    compare different: a difference reported in excess, never an identity. For comparison
    only."""
    def whole(match: re.Match[bytes]) -> bool:
        return match.start() == 0 or data[match.start() - 1] not in _NAME_BYTES

    numbers: dict[bytes, dict[bytes, None]] = {}
    for match in filter(whole, _COUNTER_NAMED.finditer(data)):
        numbers.setdefault(match[1], {}).setdefault(match[2], None)
    renumber = {
        (family, old): new
        for family, seen in numbers.items()
        for old, new in zip(seen, sorted(seen, key=int), strict=True)
    }
    if all(old == new for (_, old), new in renumber.items()):
        return data  # (already in order: spare the 100 MB rewrite)
    return _COUNTER_NAMED.sub(
        lambda m: m[1] + b"_" + renumber[m[1], m[2]] if whole(m) else m[0], data)


#: Length-delimited protobuf field tags whose runs of entries may be serialized in any order:
#: fields 2 to 15, and 100 (the Core ML model's user-defined metadata).
_ENTRY_TAGS = (b"\xa2\x06", *(bytes([(f << 3) | 2]) for f in range(2, 16)))


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


#: Where an entry of :data:`_ENTRY_TAGS` can start: its tag, a varint (the length), field 1's
#: tag (a length-delimited field 1, ``0x0a``). Only there can a run of entries start, and the
#: scan skips the bytes between in one step. (Measured on random bytes, as weights look: 2.2 s
#: for 100 MiB; byte by byte, and visiting every lone entry's payload, 32 s for 1 MiB, and
#: growing with the square of the size.)
_ENTRY_START = re.compile(
    b"(?P<tag>" + b"|".join(re.escape(t) for t in _ENTRY_TAGS) + rb")[\x80-\xff]*[\x00-\x7f]\x0a"
)


def _sorted_entries(data: bytes, depth: int = 0) -> bytes:
    """``data`` with every run of two or more consecutive length-delimited entries of one tag
    whose payload starts with field 1 (protobuf map entries, and repeated messages) sorted,
    recursively. Lengths are kept, so offsets are too. For comparison only."""
    out, i, n = bytearray(), 0, len(data)
    while i < n:
        candidate = _ENTRY_START.search(data, i)
        if candidate is None:
            out += data[i:]
            break
        out += data[i:candidate.start()]
        i = candidate.start()
        tag = candidate["tag"]  # (the tags are prefix-free: one can start here)
        spans, k = [], i  # (entry start, payload start, end) of each entry of the run
        while data.startswith(tag, k):
            try:
                length, start = _varint(data, k + len(tag))
            except IndexError:
                break
            end = start + length
            if end > n or length < 2 or data[start] != 0x0A:
                break
            spans.append((k, start, end))
            k = end
        # Only a run's payloads are visited: in random bytes a lone "entry" can span most of
        # the data, and there is one at every few thousand bytes.
        if len(spans) >= 2:
            out += b"".join(sorted(
                data[a:start] + (_sorted_entries(data[start:end], depth + 1)
                                 if depth < 8 else data[start:end])
                for a, start, end in spans
            ))
            i = k
        else:
            out.append(data[i])
            i += 1
    return bytes(out)


# --------------------------------------------------------------------------- the pytest plugin


def install_memos() -> None:
    """Install every memo of the backends' pattern graphs whose backend imports: the server's
    own (``remote_partitioner.server.pattern_memo``: :func:`memoize_coreml_pattern_graphs` and
    :func:`memoize_xnnpack_pattern_graphs` for the quantizers, which make the quantize stage
    of a ``coreml_static_int8`` or ``xnnpack_static_int8_per_channel`` test several times
    faster, and :func:`memoize_vulkan_pattern_graphs`), which ``remote-partitioner serve``
    installs too. The quantizers' memos change only the quantize stage, which runs before any
    partitioner and is the same code for both runs of a test: the lowerings compared are
    untouched. (Tests read the first two here, as this module's attributes.)"""
    memoize_coreml_pattern_graphs()
    memoize_xnnpack_pattern_graphs()
    memoize_vulkan_pattern_graphs()


def flow_suffix(*, remote_quantizer: bool = False, remote_preprocess: bool = False) -> str:
    """What the twin's flow name is tabled and logged with after the flow's name: ``""``,
    ``+remote-quantizer``, ``+server-preprocess`` or, both, ``+remote-quantizer+server-preprocess``
    (always in that order)."""
    return ((REMOTE_QUANTIZER_SUFFIX if remote_quantizer else "")
            + (SERVER_PREPROCESS_SUFFIX if remote_preprocess else ""))


#: The keyword arguments, and the values of each, that :func:`quantizer_spec` tries when it
#: looks for the ``get_symmetric_quantization_config`` call that made a quantizer's global
#: config: per hosted quantizer, (module of the function and the quantizer class, the class
#: name, {keyword: values}). Each keyword is also tried absent; the other keywords (the
#: quant_min/max ones) only absent. The product is kept under the functions' ``lru_cache`` size
#: (128): the candidate calls add cache entries, and the one sought must not be evicted first.
_CONFIG_CANDIDATES: dict[str, tuple[str, str, dict[str, tuple[object, ...]]]] = {
    "xnnpack": ("executorch.backends.xnnpack.quantizer.xnnpack_quantizer", "XNNPACKQuantizer",
                {"is_per_channel": (True, False), "is_qat": (False, True),
                 "is_dynamic": (False, True)}),
    "vulkan": ("executorch.backends.vulkan.quantizer.vulkan_quantizer", "VulkanQuantizer",
               {"is_dynamic": (False, True), "weight_bits": (8, 4), "act_bits": (8,)}),
}


def arm_twin_spec(compile_spec: Any) -> tuple[str, dict[str, Any]]:
    """The hosted Arm target (``"arm_tosa"``, ``"ethos_u55"``, ``"ethos_u85"``) and the spec
    from which the server builds a compile spec equal to ``compile_spec`` (a
    ``TosaCompileSpec`` or ``EthosUCompileSpec``, as ExecuTorch's Arm test flows make them):
    the TOSA specification; or the MACs, Vela configuration file, system configuration, memory
    mode and extra Vela options, read back from its Vela command line (ExecuTorch's builder
    puts the extra options first, then its own).

    Raises:
        TypeError: naming what differs, when the server's compile spec for that spec is not
            equal to ``compile_spec`` (intermediate artifacts, debug modes, other options):
            the twin is never compared with another compile spec.
    """
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    from remote_partitioner.server.backends.arm import (
        ETHOS_U_TARGETS,
        ethos_u_compile_spec,
        tosa_compile_spec,
    )

    spec: dict[str, Any]
    if isinstance(compile_spec, EthosUCompileSpec):
        target = str(compile_spec.target)
        name = next((n for n, (prefix, _, _) in ETHOS_U_TARGETS.items()
                     if target.startswith(prefix + "-")), None)
        if name is None:
            raise TypeError(f"no hosted Ethos-U target {target!r}")
        flags = list(compile_spec.compiler_flags)
        own = next((i for i, f in enumerate(flags) if f.startswith("--accelerator-config=")),
                   len(flags))
        spec = {"macs": int(target.rsplit("-", 1)[1])}
        for flag in flags[own:]:
            option, _, value = flag.partition("=")
            key = {"--config": "config_ini", "--system-config": "system_config",
                   "--memory-mode": "memory_mode"}.get(option)
            if key is not None:
                spec[key] = value
        if flags[:own]:
            spec["extra_flags"] = " ".join(flags[:own])
        rebuilt = ethos_u_compile_spec(name, spec)
    else:
        name, spec = "arm_tosa", {"tosa_spec": str(compile_spec.tosa_spec)}
        rebuilt = tosa_compile_spec(spec)
    if rebuilt != compile_spec:
        raise TypeError(f"no hosted {name} spec rebuilds the compile spec {vars(compile_spec)} "
                        f"(the server would build {vars(rebuilt)})")
    return name, spec


def quantizer_spec(quantizer: Any) -> tuple[str, dict[str, Any]]:
    """The hosted quantizer (``"xnnpack"``, ``"vulkan"``, ``"coreml"``, ``"openvino"``) and
    spec whose ``RemoteQuantizer`` rebuilds ``quantizer`` exactly as the server builds it,
    derived from the object itself (not from a flow's name):

    * ``XNNPACKQuantizer`` / ``VulkanQuantizer``: the server builds
      ``Quantizer().set_global(get_symmetric_quantization_config(**spec))``, calling that
      ``functools.lru_cache``d function with the spec's keys only, in its parameter order. The
      spec is the candidate (:data:`_CONFIG_CANDIDATES`, fewest keys first) whose call returns
      the very object (``is``) that is ``quantizer.global_config``, and ``quantizer`` must hold
      nothing else (its attributes equal those of a fresh quantizer given that config: no
      operator, module type or name configs, no filter function).
    * ``OpenVINOQuantizer``: ``{}`` or ``{"mode": MODE}`` (a hosted mode) when its NNCF
      algorithm's settings equal those of ``OpenVINOQuantizer(mode=MODE)``, as the server builds
      it (ExecuTorch's ``openvino_int8`` flow quantizes with ``OpenVINOQuantizer()``).
    * ``CoreMLQuantizer``: ``{}`` when its config equals the one ExecuTorch's Core ML tester
      quantizes with (``_get_static_int8_linear_qconfig()``), which the server's ``coreml``
      quantizer builds for ``{}``.
    * ``TOSAQuantizer`` / ``EthosUQuantizer``: the hosted Arm target and compile spec keys of
      its compile spec (:func:`arm_twin_spec`), and the arguments of the Arm
      ``get_symmetric_quantization_config`` call (``functools.lru_cache``d, found as for
      XNNPACK) whose object is its global config; nothing else set (no ``set_io``, no
      operator or module configs).

    Raises:
        TypeError: naming ``quantizer``, when no spec rebuilds it (another class, a config made
            otherwise, other settings): the twin is never compared with another quantizer.
    """
    import inspect
    import itertools

    kind = type(quantizer).__name__
    for name, (module_name, class_name, candidates) in _CONFIG_CANDIDATES.items():
        if kind != class_name:
            continue
        module = importlib.import_module(module_name)
        if type(quantizer) is not getattr(module, class_name):
            break
        make_config = module.get_symmetric_quantization_config
        target = getattr(quantizer, "global_config", None)
        order = list(inspect.signature(make_config).parameters)
        options = [[(key, value) for value in values] for key, values in candidates.items()]
        specs = [dict(c) for n in range(len(options) + 1)
                 for keys in itertools.combinations(options, n) for c in itertools.product(*keys)]
        assert len(specs) < (make_config.cache_info().maxsize or len(specs) + 1)
        for spec in specs:
            spec = {k: spec[k] for k in order if k in spec}
            try:
                config = make_config(**spec)
            except (ValueError, TypeError, AssertionError):
                continue
            if target is not None and config is target:
                reference = getattr(module, class_name)().set_global(target)
                if vars(reference) == vars(quantizer):
                    return name, spec
                break
        break
    if kind == "OpenVINOQuantizer":
        from executorch.backends.openvino.quantizer.quantizer import OpenVINOQuantizer

        from remote_partitioner.server.backends.openvino import QUANTIZER_MODES

        def settings(q: Any) -> dict[str, Any]:
            # NNCF's algorithm object, but its per-instance key and the constraints it derives
            # from the other settings (objects without equality)
            return {k: v for k, v in vars(q._algo).items()
                    if k not in ("_algorithm_key", "_global_quantizer_constraints")}

        mode = getattr(getattr(quantizer, "mode", None), "value", None)
        if type(quantizer) is OpenVINOQuantizer and mode in QUANTIZER_MODES:
            reference = OpenVINOQuantizer(mode=quantizer.mode)
            if settings(reference) == settings(quantizer):
                return "openvino", ({} if mode == "int8_sym" else {"mode": mode})
    if kind in ("TOSAQuantizer", "EthosUQuantizer"):
        arm = _arm_quantizer_spec(quantizer)
        if arm is not None:
            return arm
    if kind == "CoreMLQuantizer":
        from executorch.backends.apple.coreml.quantizer import CoreMLQuantizer
        from executorch.backends.apple.coreml.test.tester import _get_static_int8_linear_qconfig

        if (type(quantizer) is CoreMLQuantizer
                and vars(quantizer) == vars(CoreMLQuantizer(_get_static_int8_linear_qconfig()))):
            return "coreml", {}
    raise TypeError(f"no hosted quantizer and spec rebuild {quantizer!r} ({kind}): a "
                    "RemoteQuantizer would quantize with another configuration")


def _arm_quantizer_spec(quantizer: Any) -> tuple[str, dict[str, Any]] | None:
    """:func:`quantizer_spec` for an Arm quantizer, or None when no spec rebuilds it."""
    import itertools

    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.backends.arm.util._factory import create_quantizer

    if type(quantizer) not in (TOSAQuantizer, EthosUQuantizer):
        return None
    inner = quantizer.quantizer
    name, target_spec = arm_twin_spec(inner.compile_spec)
    candidates = {"is_per_channel": (True, False), "is_qat": (False, True),
                  "is_dynamic": (False, True)}
    options = [[(key, value) for value in values] for key, values in candidates.items()]
    for n in range(len(options) + 1):
        for keys in itertools.combinations(options, n):
            for combination in itertools.product(*keys):
                config_spec = dict(combination)
                config = get_symmetric_quantization_config(**config_spec)
                if config is not inner.global_config:
                    continue
                reference = create_quantizer(inner.compile_spec)
                reference.set_global(config)
                ref = reference.quantizer
                same = (type(reference) is type(quantizer)
                        and reference.use_composable_quantizer == quantizer.use_composable_quantizer
                        and type(ref) is type(inner) and ref.compile_spec == inner.compile_spec
                        and ref._quantizers == inner._quantizers == []
                        and ref._graph_annotations == inner._graph_annotations == {})
                return (name, {**target_spec, **config_spec}) if same else None
    return None


def _remote_quantizer(quantizer: Any, target: str) -> Any:
    """A ``RemoteQuantizer`` on ``target`` for the hosted quantizer and spec that rebuild
    ``quantizer`` (:func:`quantizer_spec`, whose TypeError it raises)."""
    from remote_partitioner.client import RemoteQuantizer

    name, spec = quantizer_spec(quantizer)
    return RemoteQuantizer(target, name, spec, timeout=1800)


def describe_quantizer(quantizer: Any) -> str:
    """What a quantize stage ran with, for the log: ``RemoteQuantizer('NAME', {SPEC})`` (the
    server's address left out), or the quantizer's class name."""
    from remote_partitioner.client import RemoteQuantizer

    if isinstance(quantizer, RemoteQuantizer):
        return f"RemoteQuantizer({quantizer.quantizer_name!r}, {quantizer.spec!r})"
    return type(quantizer).__name__


def _remote_twin(
    partitioner: Any, target: str, flow: Any, remote_preprocess: bool = False
) -> Any:
    """A ``RemotePartitioner`` for the hosted partitioner and options ``partitioner`` was built
    with, as the suite's testers build them (``remote_preprocess``: the backend's preprocess
    runs on the server too)."""
    from remote_partitioner.client import RemotePartitioner

    options = {"timeout": 1800, "remote_preprocess": remote_preprocess}
    kind = type(partitioner).__name__
    if kind == "XnnpackPartitioner":
        return RemotePartitioner(target, "xnnpack", **options)
    if kind == "VulkanPartitioner":
        return RemotePartitioner(target, "vulkan", dict(partitioner.options), **options)
    if kind == "WebGPUPartitioner":
        # Its Vulkan partitioner holds what it was built with: the options, and the WebGPU
        # runtime's operators as the allow-list (by name, in a fixed order: a set).
        vulkan = partitioner._vulkan_partitioner
        spec = dict(vulkan.options)
        for key in ("operator_blocklist", "operator_allowlist"):
            if ops := getattr(vulkan, key):
                spec[key] = ",".join(sorted(op if isinstance(op, str) else op.__name__
                                            for op in ops))
        for key in ("nn_module_blocklist", "nn_module_allowlist"):
            if names := getattr(vulkan, key):
                spec[key] = ",".join(sorted(names))
        return RemotePartitioner(target, "webgpu", spec, **options)
    if kind == "CoreMLPartitioner":
        keywords = getattr(flow.tester_factory, "keywords", {})
        spec = {}
        if keywords.get("minimum_deployment_target") is not None:
            spec["minimum_deployment_target"] = keywords["minimum_deployment_target"].name
        return RemotePartitioner(target, "coreml", spec, **options)
    if kind in ("TOSAPartitioner", "EthosUPartitioner"):
        from executorch.backends.arm.util._factory import create_partitioner

        name, spec = arm_twin_spec(partitioner.compile_spec)
        reference = create_partitioner(partitioner.compile_spec)
        if (type(reference) is not type(partitioner) or partitioner.additional_checks
                or reference.delegation_spec.compile_specs
                != partitioner.delegation_spec.compile_specs):
            raise TypeError(f"no remote twin for this {kind}: it was not built as "
                            "create_partitioner(compile_spec) builds it")
        return RemotePartitioner(target, name, spec, **options)
    if kind == "OpenvinoPartitioner":
        spec = {}
        for compile_spec in partitioner.delegation_spec.compile_specs:
            if compile_spec.key != "device":
                raise TypeError(f"no remote twin for an OpenvinoPartitioner with the compile "
                                f"spec {compile_spec.key!r}")
            spec["device"] = compile_spec.value.decode()
        for key in ("op_types_to_skip", "op_names_to_skip"):
            if skipped := getattr(partitioner, f"_{key}"):
                spec[key] = ",".join(sorted(skipped))
        return RemotePartitioner(target, "openvino", spec, **options)
    raise TypeError(f"no remote twin for a {kind}")


@dataclasses.dataclass
class Lowering:
    """What one run of one (sub)test gave."""

    result: str
    error: str
    pte: bytes | None
    rng_after_lowering: str | None
    #: wall time of the whole (sub)test: export, lowering, running the program, comparing
    seconds: float = 0.0
    #: of which lowering (the suite's own measure)
    lower_seconds: float = 0.0
    #: what the quantize stage ran with (:func:`describe_quantizer`); None without one
    quantizer: str | None = None


@dataclasses.dataclass
class Comparison:
    """One (sub)test, run with the flow and with its remote twin."""

    test: str
    flow: str
    subtest: int
    local: Lowering
    remote: Lowering
    differences: list[str]

    def as_json(self) -> dict[str, Any]:
        def side(x: Lowering) -> dict[str, Any]:
            return {
                "result": x.result, "error": x.error[:500],
                "pte_sha256": hashlib.sha256(x.pte).hexdigest() if x.pte is not None else None,
                "pte_bytes": len(x.pte) if x.pte is not None else None,
                "seconds": round(x.seconds, 3), "lower_seconds": round(x.lower_seconds, 3),
                **({"quantizer": x.quantizer} if x.quantizer is not None else {}),
            }

        return {"test": self.test, "flow": self.flow, "subtest": self.subtest,
                "identical": not self.differences, "differences": self.differences,
                "local": side(self.local), "remote": side(self.remote)}


class ConformancePlugin:
    """Runs every suite test with its flow and the flow's remote twin, and compares."""

    def __init__(
        self, target: str, flows: list[str], seed: int, json_path: Path | None,
        *, resume: bool = False, remote_preprocess: bool = False,
        remote_quantizer: bool = False,
        shard: tuple[int, int] | None = None, memoize: bool = True,
        timeout_factor: float = TWIN_TIMEOUT_FACTOR,
    ) -> None:
        self.target = target
        #: A test's timeout, as a multiple of the suite's own (``--timeout-factor``).
        self.timeout_factor = timeout_factor
        #: Build the backends' pattern graphs once per process (:func:`install_memos`); the
        #: server must then have them too (:func:`serve`).
        self.memoize = memoize
        #: (i, n): run only every n-th collected test from the i-th (``--jobs``); the report
        #: goes to :func:`shard_report` of ``json_path``, the log is the one all shards share.
        self.shard = shard
        #: The twins run the backends' preprocess on the server too (``--remote-preprocess``);
        #: their results are logged and tabled under ``FLOW+server-preprocess``.
        self.remote_preprocess = remote_preprocess
        #: The twins' quantize stage runs a ``RemoteQuantizer`` for the hosted quantizer and
        #: spec that rebuild the flow's own (``--remote-quantizer``; :func:`quantizer_spec`):
        #: every flow must have a quantize stage. Tabled under ``FLOW+remote-quantizer``.
        self.remote_quantizer = remote_quantizer
        self.suffix = flow_suffix(remote_quantizer=remote_quantizer,
                                  remote_preprocess=remote_preprocess)
        self.flows = flows
        self.seed = seed
        self.json_path = json_path
        self.comparisons: list[Comparison] = []
        self.tests: dict[str, str] = {}  # test id -> flow, every test that ran
        #: test modules that could not be imported (a model suite whose package, torchvision or
        #: torchaudio, is not installed): file -> the error's last line.
        self.not_collected: dict[str, str] = {}
        #: The commit this run compares (``+`` when the work tree has changes).
        self.commit = _commit()
        #: The tests that hit their timeout (the run stops at the first: see
        #: pytest_runtest_logreport).
        self.timed_out: list[str] = []
        self.session: Any = None
        #: (flow, test name) of the tests a resumed log already holds, complete.
        self.done: set[tuple[str, str]] = set()
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            # The log is only ever appended to: a later run of a test supersedes its earlier
            # lines (see read_log), and no run erases what earlier sittings measured.
            log = json_path.with_suffix(".jsonl")
            if resume and log.exists():
                self.done = {(r["flow"], r["test"]) for r in read_log([log])["complete"]}
        self._patch_suite()

    def _patch_suite(self) -> None:
        """Keep only the chosen flows, and seed each test from its name and ``seed`` (the
        suite draws a random run seed outside a session: both runs must share it)."""
        from executorch.backends.test.suite import flow as flow_module
        from executorch.backends.test.suite import runner

        every = flow_module.all_flows()
        missing = [f for f in self.flows if f not in every]
        if missing:
            where = [f"{f} (make venv-{env}: its environment's Python)"
                     for f in missing for env, flows in ENVIRONMENT_FLOWS.items() if f in flows]
            raise SystemExit(f"flows not available in this process: {missing}"
                             + (f"; run {', '.join(where)}" if where else ""))
        chosen = {name: every[name] for name in self.flows}
        unquantized = [name for name, flow in chosen.items() if not flow.quantize]
        if self.remote_quantizer and unquantized:
            raise SystemExit(f"--remote-quantizer: flows without a quantize stage: {unquantized}")
        flow_module.all_flows = lambda: dict(chosen)

        def test_seed(test_base_name: str) -> int:
            digest = hashlib.md5(test_base_name.encode()).digest()
            return int.from_bytes(digest, "little") % 100_000_000 + self.seed

        runner._get_test_seed = test_seed
        # XNNPACK's preprocess builds its pattern graphs from random inputs once per process
        # (lru_cache): built here, so that the first test's local run does not draw for both.
        try:
            from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

            bilinear_2d.get_graphs()
            sdpa.get_graphs()
        except ImportError:
            pass
        if self.memoize:
            install_memos()

    def pytest_collection_finish(self, session: Any) -> None:
        """Replace the suite conftest's ``TestRunner`` (its ``test_runner`` fixture builds one
        per test) by one that runs both flows."""
        patched = False
        for plugin in session.config.pluginmanager.get_plugins():
            path = str(getattr(plugin, "__file__", "") or "").replace(os.sep, "/")
            if path.endswith("backends/test/suite/conftest.py"):
                plugin.TestRunner = self._runner_class()
                patched = True
        if not patched and session.items:
            raise RuntimeError("the suite's conftest.py was not loaded: nothing to patch")

    def _runner_class(self) -> type:
        plugin = self

        class TwinRunner:
            """The suite's TestRunner, lowering every model with both flows."""

            def __init__(self, flow: Any, test_name: str, test_base_name: str) -> None:
                self._flow = flow
                self._test_name = test_name
                self._test_base_name = test_base_name
                self._subtest = 0
                self._results: list[Any] = []

            def lower_and_run_model(
                self, model: Any, inputs: Any, generate_random_test_inputs: bool = True,
                dynamic_shapes: Any = None,
            ) -> None:
                comparison = plugin.compare(
                    self._flow, self._test_name, self._test_base_name, self._subtest,
                    model, inputs, generate_random_test_inputs, dynamic_shapes,
                )
                self._subtest += 1
                if comparison.differences:
                    raise AssertionError(
                        f"{self._test_name}: remote differs from local: "
                        + "; ".join(comparison.differences)
                    )

        return TwinRunner

    def compare(
        self, flow: Any, test_name: str, base_name: str, subtest: int, model: Any,
        inputs: Any, random_inputs: bool, dynamic_shapes: Any,
    ) -> Comparison:
        """Run (sub)test ``subtest`` with ``flow`` and its remote twin; record the comparison."""
        twin = dataclasses.replace(
            flow, name=f"{flow.name}@remote",
            tester_factory=self._twin_factory(flow),
        )
        local = self._run(flow, test_name, base_name, subtest, copy.deepcopy(model),
                          copy.deepcopy(inputs), random_inputs, dynamic_shapes)
        remote = self._run(twin, test_name, base_name, subtest, copy.deepcopy(model),
                           copy.deepcopy(inputs), random_inputs, dynamic_shapes)
        differences = []
        if local.result != remote.result:
            differences.append(f"outcome: local {local.result}, remote {remote.result}"
                               + (f" ({remote.error[:300]})" if remote.error else ""))
        if local.pte is not None or remote.pte is not None:
            a, b = local.pte, remote.pte
            if flow.backend == "coreml" and a is not None and b is not None:
                # Preprocess on the server: the Core ML model was written by another process.
                across = self.remote_preprocess
                a, b = (normalize_coreml(x, across_processes=across) for x in (a, b))
            elif flow.backend == "openvino" and a is not None and b is not None:
                a, b = normalize_openvino(a), normalize_openvino(b)
            if a != b:
                differences.append(
                    f".pte: local {len(local.pte) if local.pte is not None else None} bytes, "
                    f"remote {len(remote.pte) if remote.pte is not None else None} bytes, differ"
                    + self._keep(test_name, subtest, local.pte, remote.pte)
                )
        if local.rng_after_lowering != remote.rng_after_lowering:
            differences.append("random generator state after lowering differs")
        if (local.quantizer is None) != (remote.quantizer is None):
            differences.append(
                f"quantize stage: local {local.quantizer}, remote {remote.quantizer}")
        elif (self.remote_quantizer and remote.quantizer is not None
              and not remote.quantizer.startswith("RemoteQuantizer(")):
            # (the twin could not rebuild the flow's quantizer: quantizer_spec's TypeError)
            differences.append(f"quantize stage: the twin ran {remote.quantizer}, not a "
                               f"RemoteQuantizer ({remote.error[:300]})")
        comparison = Comparison(
            test_name, flow.name + self.suffix, subtest, local, remote, differences
        )
        self.comparisons.append(comparison)
        self._log({**comparison.as_json(), "commit": self.commit})
        return comparison

    def _keep(self, test: str, subtest: int, local: bytes | None, remote: bytes | None) -> str:
        """Write the two programs of a .pte difference beside the log, for a closer look; the
        note naming where they are (empty without a log)."""
        if self.json_path is None:
            return ""
        folder = self.json_path.parent / f"{self.json_path.stem}-differing"
        folder.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{test}#{subtest}")
        for side, pte in (("local", local), ("remote", remote)):
            if pte is not None:
                (folder / f"{stem}.{side}.pte").write_bytes(pte)
        return f" (both kept in {folder}/{stem}.*.pte)"

    def _log(self, line: dict[str, Any]) -> None:
        """One line per comparison, and one when a test is complete, as they happen: a long
        run can be followed, and resumed after an interruption (``--resume``)."""
        if self.json_path is not None:
            with self.json_path.with_suffix(".jsonl").open("a") as log:
                log.write(json.dumps(line) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> None:
        """Give each test the time of its two lowerings: the suite's per-test timeout
        (``FLOW_TEST_CASE_TIMEOUTS``, marked by its conftest) is for one, the twin runs two.
        With ``--resume``, leave out the tests the log already holds, complete."""
        for item in items:
            marker = item.get_closest_marker("timeout")
            if marker is not None and marker.args and isinstance(marker.args[0], (int, float)):
                item.add_marker(pytest.mark.timeout(self.timeout_factor * marker.args[0]),
                                append=False)
        keep: list[Any] = []
        skipped: list[Any] = []
        for index, item in enumerate(items):
            # Shards are dealt from the whole collection, before the log is consulted: the
            # shards of one run read the log at different moments.
            other_shard = self.shard is not None and index % self.shard[1] != self.shard[0]
            done = (_flow_of(item.name) + self.suffix, item.name) in self.done
            (skipped if done or other_shard else keep).append(item)
        if not skipped:
            return
        items[:] = keep
        config.hook.pytest_deselected(items=skipped)

    def _twin_factory(self, flow: Any) -> Callable[..., Any]:
        from executorch.backends.test.harness.stages import StageType

        target, remote_preprocess = self.target, self.remote_preprocess
        remote_quantizer = self.remote_quantizer

        def factory(*args: Any, **kwargs: Any) -> Any:
            tester = flow.tester_factory(*args, **kwargs)
            make = tester.stage_classes[StageType.TO_EDGE_TRANSFORM_AND_LOWER]
            if remote_quantizer:
                # The suite's runner passes the flow's quantize_stage_factory() stage to
                # tester.quantize (XNNPACK, Vulkan), or None for the tester's default stage,
                # stage_classes[QUANTIZE] (Core ML): whichever it is, the twin's stage keeps
                # everything (calibration, QAT, fold_quantize) but its quantizer, replaced by
                # the RemoteQuantizer that rebuilds it (its TypeError raised from quantize).
                quantize = tester.quantize

                def remote_quantize(stage: Any = None) -> Any:
                    stage = stage or tester._get_default_stage(StageType.QUANTIZE)
                    stage.quantizer = _remote_quantizer(stage.quantizer, target)
                    return quantize(stage)

                tester.quantize = remote_quantize

            def make_stage(*a: Any, **k: Any) -> Any:
                stage = make(*a, **k)
                stage.partitioners = [
                    _remote_twin(p, target, flow, remote_preprocess) for p in stage.partitioners
                ]
                return stage

            tester.stage_classes = {**tester.stage_classes,
                                    StageType.TO_EDGE_TRANSFORM_AND_LOWER: make_stage}
            if type(tester).__name__ == "ArmTester":
                # ArmTester builds its stage itself, not from stage_classes, with the
                # partitioner create_partitioner(compile_spec) makes: given the twin instead.
                from executorch.backends.arm.util._factory import create_partitioner

                lower = tester.to_edge_transform_and_lower

                def remote_lower(stage: Any = None, *a: Any, **k: Any) -> Any:
                    if stage is not None or k.get("partitioners") is not None:
                        raise TypeError("the Arm twin lowers as the suite does: no stage or "
                                        "partitioners given")
                    k["partitioners"] = [_remote_twin(create_partitioner(tester.compile_spec),
                                                      target, flow, remote_preprocess)]
                    return lower(None, *a, **k)

                tester.to_edge_transform_and_lower = remote_lower
            return tester

        return factory

    def _run(
        self, flow: Any, test_name: str, base_name: str, subtest: int, model: Any,
        inputs: Any, random_inputs: bool, dynamic_shapes: Any,
    ) -> Lowering:
        import torch
        from executorch.backends.test.harness.stages import StageType
        from executorch.backends.test.suite import runner

        # The run before this one (the local twin of this test, or the last test) may leave
        # its programs in reference cycles (a failure's traceback holds the frames): free them
        # first, or a large model's two lowerings are in memory at once.
        gc.collect()
        testers: list[Any] = []
        rng: list[str] = []
        quantizers: list[str] = []
        make_tester = flow.tester_factory
        if flow.backend == "coreml":
            # Each lowering converts from the state a fresh process has: coremltools keeps its
            # name counters after a conversion that raised, so the twin run after it would be
            # written with other names (see coremltools_fresh_state); the server does the same
            # before each preprocess it runs.
            from remote_partitioner.server.backends.coreml import coremltools_fresh_state

            coremltools_fresh_state()

        def recording_rng(call: Callable[..., Any]) -> Callable[..., Any]:
            """``call``, then the generator's state after it appended to ``rng``."""
            def run_and_record(*a: Any, **k: Any) -> Any:
                out = call(*a, **k)
                state = torch.get_rng_state().numpy().tobytes()
                rng.append(hashlib.sha256(state).hexdigest())
                return out

            return run_and_record

        def factory(*args: Any, **kwargs: Any) -> Any:
            tester = make_tester(*args, **kwargs)
            make = tester.stage_classes[StageType.TO_EDGE_TRANSFORM_AND_LOWER]

            def make_stage(*a: Any, **k: Any) -> Any:
                stage = make(*a, **k)
                stage.run = recording_rng(stage.run)
                return stage

            tester.stage_classes = {**tester.stage_classes,
                                    StageType.TO_EDGE_TRANSFORM_AND_LOWER: make_stage}
            if type(tester).__name__ == "ArmTester":
                # (its stage is not built from stage_classes: the state after the call)
                tester.to_edge_transform_and_lower = recording_rng(
                    tester.to_edge_transform_and_lower)
            quantize = tester.quantize

            def quantize_and_record(stage: Any = None) -> Any:
                stage = stage or tester._get_default_stage(StageType.QUANTIZE)
                try:
                    return quantize(stage)
                finally:  # (what it ran with: the twin's replaces it first, or raises)
                    quantizers.append(describe_quantizer(getattr(stage, "quantizer", None)))

            tester.quantize = quantize_and_record
            testers.append(tester)
            return tester

        start = time.perf_counter()
        summary = runner.run_test(
            model, inputs, dataclasses.replace(flow, tester_factory=factory), test_name,
            base_name, subtest, None, dynamic_shapes=dynamic_shapes,
            generate_random_test_inputs=random_inputs,
        )
        seconds = time.perf_counter() - start
        pte = None
        if testers:
            tester = testers[0]
            serialized = tester.stages.get(StageType.SERIALIZE)
            lowered = tester.stages.get(StageType.TO_EDGE_TRANSFORM_AND_LOWER)
            try:
                if serialized is not None and serialized.artifact is not None:
                    pte = bytes(serialized.artifact)
                elif lowered is not None and lowered.artifact is not None:
                    pte = bytes(lowered.artifact.to_executorch().buffer)
            except Exception:
                pte = None
        error = f"{type(summary.error).__name__}: {summary.error}" if summary.error else ""
        lower = summary.lower_time.total_seconds() if summary.lower_time else 0.0
        return Lowering(summary.result.name, error, pte, rng[0] if rng else None, seconds, lower,
                        quantizers[0] if quantizers else None)

    def pytest_runtest_logreport(self, report: Any) -> None:
        # pytest-timeout interrupts the test wherever it is, torch's dispatcher included; every
        # later test of this process then fails before lowering anything ("... PythonDispatcherTLS
        # was not set"). The run stops there (rather than log them all uncompared), and the test
        # is logged timed out: not complete, whatever it compared before (see read_log).
        timed_out = TIMEOUT_FAILURE in str(report.longrepr)  # in any phase; failed, or xfailed
        name = report.nodeid.rsplit("::", 1)[-1]
        if report.when == "call" or (report.when == "setup" and report.skipped) or timed_out:
            flow = _flow_of(report.nodeid) + self.suffix
            self.tests[report.nodeid] = flow
            self._log({"test": name, "flow": flow, "complete": True,
                       "outcome": report.outcome, "commit": self.commit,
                       **({"timed_out": True} if timed_out else {})})
        if timed_out:
            self.timed_out.append(name)
            if self.session is not None:
                self.session.shouldstop = (
                    f"{name} timed out, which leaves torch broken in this process: the run "
                    "stops here. Run the rest with --resume, and give slow tests more time "
                    "with --timeout-factor")

    def pytest_sessionstart(self, session: Any) -> None:
        self.session = session

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            lines = str(report.longrepr).strip().splitlines()
            self.not_collected[report.nodeid] = lines[-1].lstrip("E ").strip() if lines else "?"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        write("")
        write(format_table(self.table()))
        for module, error in sorted(self.not_collected.items()):
            write(f"not run: {module}: {error}")
        if self.json_path is not None:
            path = (self.json_path if self.shard is None
                    else shard_report(self.json_path, self.shard[0]))
            write_report(path, self.seed, [f + self.suffix for f in self.flows],
                         [c.as_json() for c in self.comparisons], self.not_collected)
            write(f"wrote {path}")

    def table(self) -> dict[str, dict[str, float]]:
        """This run's per-flow table (see :func:`flow_table`)."""
        return flow_table(
            [c.as_json() for c in self.comparisons], [f + self.suffix for f in self.flows]
        )


def write_report(
    path: Path, seed: int, flows: list[str], comparisons: list[dict[str, Any]],
    not_collected: dict[str, str],
) -> None:
    """The run's JSON report: its seed, per-flow table, modules not collected, comparisons."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(
        {"seed": seed, "flows": flow_table(comparisons, flows), "not_collected": not_collected,
         "comparisons": comparisons}, indent=1))


def shard_report(json_path: Path, index: int) -> Path:
    """Where shard ``index`` of a ``--jobs`` run writes its report (``json_path``'s is the
    merged one)."""
    return json_path.with_name(f"{json_path.stem}.shard{index}.json")


def flow_table(
    comparisons: list[dict[str, Any]], flows: list[str],
    row_of: Callable[[dict[str, Any]], str] = lambda line: str(line["flow"]),
) -> dict[str, dict[str, float]]:
    """Per flow (``flows`` first, then any other a comparison names): tests (lowerings
    compared), identical, differing, failing remote only (the local run succeeded, the remote
    one did not), and the seconds spent lowering locally and remotely. ``comparisons`` are
    :meth:`Comparison.as_json` dicts, as the log holds them; ``row_of`` names a comparison's
    row (its flow, or :func:`flow_and_suite`)."""
    rows: dict[str, dict[str, float]] = {}
    ok = ("SUCCESS", "SUCCESS_UNDELEGATED")
    for flow in [*flows, *(row_of(c) for c in comparisons)]:
        rows.setdefault(flow, _empty_row())
    for c in comparisons:
        row = rows[row_of(c)]
        row["tests"] += 1
        row["identical" if c["identical"] else "differing"] += 1
        if c["local"]["result"] in ok and c["remote"]["result"] not in ok:
            row["failing_remote_only"] += 1
        row["local_lower_seconds"] += c["local"]["lower_seconds"]
        row["remote_lower_seconds"] += c["remote"]["lower_seconds"]
    return rows


def _empty_row() -> dict[str, float]:
    """A row of :func:`flow_table` with nothing counted."""
    return {"tests": 0, "identical": 0, "differing": 0, "failing_remote_only": 0,
            "local_lower_seconds": 0.0, "remote_lower_seconds": 0.0}


@functools.cache
def model_tests() -> frozenset[str]:
    """The names of the test functions of the suite's ``models/`` (read, not imported: its
    modules import torchvision and torchaudio)."""
    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    directory = Path(next(iter(spec.submodule_search_locations))) / "backends/test/suite/models"
    names = {node.name for path in sorted(directory.glob("test_*.py"))
             for node in ast.parse(path.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    assert names, f"no model tests in {directory}"
    return frozenset(names)


def suite_of(test: str) -> str:
    """The suite (:data:`SUITES`) a logged test name (``test_x[FLOW-...]``) belongs to."""
    return "models" if test.split("[", 1)[0] in model_tests() else "operators"


def flow_and_suite(line: dict[str, Any]) -> str:
    """A log line's row in the accumulated table: ``FLOW, SUITE``."""
    return f"{line['flow']}, {suite_of(line['test'])}"


def _flow_of(test: str) -> str:
    """The flow a suite test's name or node id is parametrized with: ``test_x[FLOW-...]``."""
    match = re.search(r"\[([^\]-]+)", test)
    return match.group(1) if match else "?"


def _commit() -> str:
    """The repository's HEAD, with ``+`` when the work tree has changes (other than the logs
    of ``conformance/results``, which runs append to); "" outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)conformance/results"],
                               cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+" if dirty.strip() else "")


def read_log(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """The comparisons and complete-test lines of ``.jsonl`` logs, for the tests the logs hold
    complete (an interrupted test's comparisons are left out, also when the test ran again
    after it: each run's comparisons start at subtest 0); a test logged more than once counts
    as its last complete run. A test that failed without a single comparison is not
    complete but ``uncompared`` (its failure says nothing of the remote path: a pytest-timeout
    that interrupts torch mid-dispatch leaves the process failing every later test with
    "PythonDispatcherTLS was not set"), so ``--resume`` runs it again; so is a test that timed
    out, whatever it compared before."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    complete: dict[tuple[str, str], dict[str, Any]] = {}
    uncompared: dict[tuple[str, str], dict[str, Any]] = {}
    pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            if not text.strip():
                continue
            line = json.loads(text)
            key = (line["flow"], line["test"])
            if line.get("complete"):
                run = pending.pop(key, [])
                if line.get("timed_out") or (line.get("outcome") == "failed" and not run):
                    uncompared[key] = line
                    continue
                complete[key] = line
                runs[key] = run
            else:
                if line.get("subtest") == 0:  # a run of the test starts: any lines before
                    pending[key] = []  # it are an interrupted run's (never complete)
                pending.setdefault(key, []).append(line)
    return {"complete": list(complete.values()),
            "comparisons": [c for key in complete for c in runs.get(key, [])],
            "uncompared": [t for key, t in uncompared.items() if key not in complete]}


def log_table(
    log: dict[str, list[dict[str, Any]]], flows: list[str]
) -> dict[str, dict[str, float]]:
    """The table of accumulated logs (``log`` as :func:`read_log` returns it): a row per flow
    and suite (``FLOW, SUITE``, ``flows``' first), with :func:`flow_table`'s columns and
    ``complete``, the tests the logs hold complete."""
    rows = flow_table(log["comparisons"], [f"{f}, {s}" for f in flows for s in SUITES],
                      flow_and_suite)
    for line in log["complete"]:  # (a test skipped before lowering compared nothing)
        rows.setdefault(flow_and_suite(line), _empty_row())
    for label, row in rows.items():
        row["complete"] = sum(1 for t in log["complete"] if flow_and_suite(t) == label)
    return rows


def summarize_logs(paths: list[Path], flows: list[str]) -> tuple[str, int]:
    """The table of accumulated logs (:func:`log_table`), the differing comparisons listed after
    it, and how many differ."""
    log = read_log(paths)
    rows = log_table(log, flows)
    differing = [f"{c['flow']} {c['test']}#{c['subtest']}: " + "; ".join(c["differences"])
                 for c in log["comparisons"] if not c["identical"]]
    commits = sorted({c.get("commit", "") or "?" for c in log["comparisons"]})
    lines = [format_table(rows), "",
             "timed out or failed without a comparison (not complete, --resume reruns them): "
             + (", ".join(f"{f} {n}" for f in rows
                          if (n := sum(1 for t in log["uncompared"] if flow_and_suite(t) == f)))
                or "none"),
             f"commits compared: {', '.join(commits) or '-'}"]
    lines += ["differs: " + d for d in differing]
    return "\n".join(lines), len(differing)


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """The per-flow summary as a fixed-width table ("tests" are lowerings compared; a
    ``complete`` column, the tests run to their end, when the rows have one); the flow column
    is 50 characters wide, or as wide as its longest label needs."""
    complete = all("complete" in r for r in rows.values()) and bool(rows)
    # (a suffixed flow and its suite, "..._per_channel+remote-quantizer+server-preprocess,
    # operators", is longer than the column's 50: the column widens to fit)
    width = max([50, *(len(flow) + 2 for flow in rows)])
    header = (f"{'flow':<{width}}" + (f"{'complete tests':>16}" if complete else "")
              + f"{'tests':>7}{'identical':>11}{'differing':>11}"
              f"{'failing remote only':>21}{'lowering s local/remote':>25}")
    lines = [header, "-" * len(header)]
    for flow, r in rows.items():
        times = f"{r['local_lower_seconds']:.0f}/{r['remote_lower_seconds']:.0f}"
        lines.append(f"{flow:<{width}}" + (f"{r['complete']:>16.0f}" if complete else "")
                     + f"{r['tests']:>7.0f}{r['identical']:>11.0f}"
                     f"{r['differing']:>11.0f}{r['failing_remote_only']:>21.0f}{times:>25}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the server


#: The first argument of this script's command line that runs ``remote-partitioner`` (the rest
#: of the line) with the pattern graph memos installed (:func:`serve`).
SERVE_WITH_MEMOS = "--serve-with-memos"


@contextmanager
def serve(startup_seconds: float = 240, memoize: bool = True) -> Iterator[str]:
    """``remote-partitioner serve`` on a free loopback port; yields its target. With
    ``memoize``, the server process has the pattern graph memos the runner has
    (:func:`install_memos`), so that local and remote lowerings run the same code; without,
    it has none (``serve --no-pattern-memo``)."""
    log = open(os.devnull, "w")  # noqa: SIM115 - closed below
    command = ([sys.executable, str(Path(__file__).resolve()), SERVE_WITH_MEMOS] if memoize
               else [sys.executable, "-m", "remote_partitioner.cli"])
    proc = subprocess.Popen(
        [*command, "serve", "--address", "127.0.0.1:0",
         *([] if memoize else ["--no-pattern-memo"])],
        stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        # Out of the runner's process group: `kill -- -PGID` stops the runner, which stops
        # the server below. In the group, the server died first and the runner's test in
        # progress logged its remote lowerings as failed ("Connection refused"). (A runner
        # killed with SIGKILL leaves the server running: stop it by its own process group.)
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + startup_seconds
        line = proc.stdout.readline()
        match = re.search(r" on (127\.0\.0\.1:\d+)$", line.strip())
        if match is None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {line!r}")
        yield match.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


#: The operator library declared by allow_torchvision_without_kernels (kept alive: dropping a
#: torch.library.Library removes what it declared).
_TORCHVISION_SCHEMAS: list[Any] = []


def allow_torchvision_without_kernels() -> str | None:
    """Let ``import torchvision`` succeed when its C kernels do not load; the reason, or None.

    The only torchvision 0.28 wheel on PyPI is built against torch's CUDA build, so with the
    CPU build its ``_C`` library (the kernels of ``nms``, ``roi_align``, ...) does not load, and
    its import then fails on the two fake registrations it makes without checking for them
    ("operator torchvision::nms does not exist"). The model suite only builds torchvision's
    classification models, which call none of those kernels: declaring the two operators'
    schemas (as torchvision's C++ does) is all the import needs. Nothing is done when
    torchvision is not installed or its kernels load.
    """
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    import torch

    libraries = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"))
    try:
        if not libraries:
            raise OSError("torchvision has no _C library")
        torch.ops.load_library(str(libraries[0]))
        return None
    except OSError as e:
        reason = str(e)
    library = torch.library.Library("torchvision", "DEF")
    for name in ("nms", "qnms"):
        library.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_SCHEMAS.append(library)
    return reason


def run_jobs(args: argparse.Namespace, target: str) -> int:
    """Run ``args`` in ``args.jobs`` processes of this script, shard ``i`` taking every
    ``jobs``-th collected test from the ``i``-th, all against ``target`` and appending to one log;
    forward their output line by line (prefixed ``[i/N]``), then write and print the merged
    report. The exit status is as for one process: 1 if anything differs, 5 if nothing ran, a
    shard's own failure otherwise."""
    import threading

    n = args.jobs
    common = [sys.executable, str(Path(__file__).resolve()), "--server", target,
              "--flows", *args.flows, "--suite", *args.suite, "--seed", str(args.seed),
              "--json", str(args.json)]
    common += ["-k", args.keyword] if args.keyword else []
    common += ["--remote-preprocess"] if args.remote_preprocess else []
    common += ["--remote-quantizer"] if args.remote_quantizer else []
    common += ["--resume"] if args.resume else []
    common += ["--no-memo"] if args.no_memo else []
    common += ["--timeout-factor", str(args.timeout_factor)]
    extra = ["--", *args.pytest_args] if args.pytest_args else []
    for i in range(n):
        shard_report(args.json, i).unlink(missing_ok=True)
    children = [subprocess.Popen([*common, "--shard", f"{i}/{n}", *extra],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for i in range(n)]

    def forward(i: int, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            print(f"[{i + 1}/{n}] {line}", end="", flush=True)

    threads = [threading.Thread(target=forward, args=(i, c), daemon=True)
               for i, c in enumerate(children)]
    for t in threads:
        t.start()
    try:
        codes = [c.wait() for c in children]
    finally:  # interrupted: the shards stop as on Ctrl-C (their logs keep what they measured)
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGINT)
        for c in children:
            try:
                c.wait(timeout=60)
            except subprocess.TimeoutExpired:
                c.kill()
        for t in threads:
            t.join(timeout=10)
    comparisons: list[dict[str, Any]] = []
    not_collected: dict[str, str] = {}
    for i in range(n):
        path = shard_report(args.json, i)
        if path.exists():
            report = json.loads(path.read_text())
            comparisons += report["comparisons"]
            not_collected.update(report["not_collected"])
            path.unlink()
    suffix = flow_suffix(remote_quantizer=args.remote_quantizer,
                         remote_preprocess=args.remote_preprocess)
    flows = [f + suffix for f in args.flows]
    write_report(args.json, args.seed, flows, comparisons, not_collected)
    print(f"\nall {n} processes:\n" + format_table(flow_table(comparisons, flows)))
    for module, error in sorted(not_collected.items()):
        print(f"not run: {module}: {error}")
    print(f"wrote {args.json}", flush=True)
    failed = [code for code in codes if code not in (0, 1, 5)]
    if failed:
        return failed[0]
    if not comparisons:
        return 5
    return 1 if any(not c["identical"] for c in comparisons) else 0


def warn_of_another_hash_seed(target: str) -> None:
    """Print a warning when the server at ``target`` (``--server``) runs with another string
    hash seed than this process: its Arm lowerings then may differ from the local ones for that
    reason alone (remote_partitioner.server.hash_seed)."""
    from remote_partitioner.client.lower import LowerClient
    from remote_partitioner.server.hash_seed import current_seed

    with LowerClient(target, timeout=60) as client:
        theirs = client.list_partitioners().versions.python_hash_seed
    if theirs != current_seed() or theirs == "random":
        print(f"conformance: warning: the server runs with python hash seed {theirs or '?'}, "
              f"this runner with {current_seed()}: Arm's lowerings depend on it; start both "
              "with one fixed PYTHONHASHSEED", flush=True)


def main(argv: list[str] | None = None) -> int:
    command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SERVE_WITH_MEMOS]:
        from remote_partitioner.cli import main as cli

        install_memos()
        return cli(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    environment_flows = [f for flows in ENVIRONMENT_FLOWS.values() for f in flows]
    parser.add_argument("--flows", nargs="*", choices=[*HOSTED_FLOWS, *environment_flows],
                        help="the flows to run (default: every flow the main environment "
                        "hosts; with --remote-quantizer, every one of those with a quantize "
                        "stage); an environment's flows (" + ", ".join(environment_flows)
                        + ") run with its Python, e.g. make conformance-openvino")
    parser.add_argument("--suite", nargs="*", default=list(SUITES), choices=SUITES)
    parser.add_argument("-k", dest="keyword", help="pytest -k expression on test names")
    parser.add_argument("--seed", type=int, default=0, help="the run seed (default 0)")
    parser.add_argument("--remote-preprocess", action="store_true",
                        help="the twins run the backends' preprocess on the server too "
                        "(RemotePartitioner(remote_preprocess=True)); tabled and logged as "
                        f"FLOW{SERVER_PREPROCESS_SUFFIX}")
    parser.add_argument("--remote-quantizer", action="store_true",
                        help="the twins' quantize stage runs a RemoteQuantizer too, for the "
                        "hosted quantizer and spec that rebuild the flow's own quantizer; only "
                        f"for flows with a quantize stage ({', '.join(QUANTIZING_FLOWS)}: the "
                        "default flows then); tabled and logged as "
                        f"FLOW{REMOTE_QUANTIZER_SUFFIX}, before {SERVER_PREPROCESS_SUFFIX}")
    parser.add_argument("--server", help="an existing server's target; else one is started")
    parser.add_argument("--no-memo", action="store_true",
                        help="build the backends' pattern graphs on every use, as ExecuTorch "
                        "does (slow: by default they are built once per process, in the runner "
                        "and in the server it starts; see memoize_vulkan_pattern_graphs)")
    parser.add_argument("--timeout-factor", type=float, default=TWIN_TIMEOUT_FACTOR, metavar="F",
                        help="a test's timeout as a multiple of the suite's own, which is for "
                        f"one lowering (default {TWIN_TIMEOUT_FACTOR}: the twin lowers twice, "
                        "and a quantized LSTM test is slow here). A test that times out leaves "
                        "torch broken in its process: the run stops there and exits 2, and "
                        "--resume runs that test and the rest")
    parser.add_argument("--json", type=Path, default=Path("build/conformance.json"))
    parser.add_argument("--resume", action="store_true",
                        help="run only the tests the JSON's .jsonl log does not hold complete (a "
                        "long run over several sittings); the log is appended to either way")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run the tests in N processes sharing one server, each taking "
                        "every N-th test (their progress lines prefixed [i/N]); one report and "
                        "one log as with 1")
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # "i/N": one of --jobs' processes
    parser.add_argument("--summary", nargs="+", type=Path, metavar="LOG",
                        help="print the table of these .jsonl logs and exit (1 if any differs)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.flows is None:
        args.flows = [f for f in (QUANTIZING_FLOWS if args.remote_quantizer else HOSTED_FLOWS)
                      if f in HOSTED_FLOWS]
    if args.remote_quantizer and (other := [f for f in args.flows if f not in QUANTIZING_FLOWS]):
        parser.error(f"--remote-quantizer: {', '.join(other)} has no quantize stage (flows with "
                     f"one: {', '.join(QUANTIZING_FLOWS)})")
    if args.summary:
        suffix = flow_suffix(remote_quantizer=args.remote_quantizer,
                             remote_preprocess=args.remote_preprocess)
        text, differing = summarize_logs(args.summary, [f + suffix for f in args.flows])
        print(text)
        return 1 if differing else 0
    if command_line:
        # The local lowerings run with the seed the server runs with (it inherits this
        # process's environment): Arm's partitioner orders its partitions by Python's string
        # hash seed (remote_partitioner.server.hash_seed).
        from remote_partitioner.server.hash_seed import restart_with_fixed_seed

        restart_with_fixed_seed()

    import warnings

    warnings.filterwarnings("ignore")
    from executorch.backends.test import suite

    root = Path(suite.__file__).parent
    if "models" in args.suite and (reason := allow_torchvision_without_kernels()):
        print(f"conformance: torchvision's kernels do not load ({reason}); its models do not "
              "need them", flush=True)
    pytest_args = [str(root / s) for s in args.suite]
    pytest_args += ["-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(root),
                    "-q", "-rf", "-W", "ignore", "--tb=line",
                    # The model suites import torchvision / torchaudio, which need not be
                    # installed: such a module is listed under "not run", the rest runs.
                    "--continue-on-collection-errors"]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    pytest_args += args.pytest_args

    shard = tuple(int(x) for x in args.shard.split("/")) if args.shard else None
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    def run(target: str) -> int:
        if args.jobs > 1 and shard is None:
            return run_jobs(args, target)
        plugin = ConformancePlugin(target, args.flows, args.seed, args.json, resume=args.resume,
                                   remote_preprocess=args.remote_preprocess,
                                   remote_quantizer=args.remote_quantizer,
                                   shard=shard, memoize=not args.no_memo,  # type: ignore[arg-type]
                                   timeout_factor=args.timeout_factor)
        code = pytest.main(pytest_args, plugins=[plugin])
        rows = plugin.table()
        if plugin.timed_out:
            print(f"conformance: stopped after {plugin.timed_out[0]} timed out; the rest was not "
                  "run (--resume runs it)", flush=True)
            return int(pytest.ExitCode.INTERRUPTED)
        if int(code) not in (0, 1) or not any(r["tests"] for r in rows.values()):
            return int(code) or 5
        return 0 if all(r["differing"] == 0 for r in rows.values()) else 1

    if args.server:
        warn_of_another_hash_seed(args.server)
        return run(args.server)
    # `kill` (SIGTERM) ends a long run as Ctrl-C does: pytest stops, the log keeps what was
    # measured (an interrupted test is not complete, so --resume runs it again), and the
    # server started below is stopped rather than left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with serve(memoize=not args.no_memo) as target:
        print(f"conformance: server at {target}", flush=True)
        return run(target)


if __name__ == "__main__":
    sys.exit(main())
