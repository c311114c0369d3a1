"""The hosted ``openvino`` partitioner, quantizer and backend: ExecuTorch's
``OpenvinoPartitioner``, ``OpenVINOQuantizer`` (through NNCF) and ``OpenvinoBackend`` (its
preprocess compiles the partition with OpenVINO and exports the compiled model).

They need ``openvino`` and ``nncf`` (``executorch.backends.openvino`` imports NNCF even for
float programs), which pin numpy below the main environment's: the family is hosted by a server
in an environment of its own (``make venv-openvino``), as Arm's is.

Telemetry: NNCF starts OpenVINO's telemetry when it is imported (``openvino_telemetry``: files
under ``~/intel`` and events sent to Google Analytics). The server never lets that package load
(:func:`_telemetry_off`): NNCF then falls back to its own stub, as it does where the package is
not installed. Nothing else the hosted code runs imports it.

Every option a client sends is data: the compile spec is built here from the spec keys (no
cache folder, no configuration file, no path reaches OpenVINO from a client).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    SpecKey,
    SpecValue,
    key_table,
    list_key,
    split_list,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

    from remote_partitioner.server.backend_registry import HostedBackend
    from remote_partitioner.server.quantizers import HostedQuantizer

#: OpenVINO's telemetry package: never loaded in the server (see the module's docstring).
TELEMETRY_MODULE = "openvino_telemetry"

#: The ``OpenVINOQuantizer`` modes the server hosts: those whose annotations use torchao's
#: observers, which a client without NNCF builds. The weight-only modes (``int8wo_*``,
#: ``int4wo_*``) annotate with NNCF's own observer classes, which such a client cannot build.
QUANTIZER_MODES: tuple[str, ...] = ("int8_sym", "int8_mixed", "int8_transformer")


def _telemetry_off() -> None:
    """Make ``import openvino_telemetry`` fail in this process (``None`` in ``sys.modules``
    is Python's own way to block a module), before anything imports NNCF; NNCF then uses its
    telemetry stub (no ``~/intel`` files, no network). Raises if the package is already loaded:
    something imported NNCF before the hosted backend could turn telemetry off."""
    loaded = sys.modules.get(TELEMETRY_MODULE, None)
    if loaded is not None:
        raise RuntimeError(
            f"{TELEMETRY_MODULE} was imported before the openvino backend could block it"
        )
    sys.modules[TELEMETRY_MODULE] = None  # type: ignore[assignment]


def _require_toolchain() -> None:
    """ModuleNotFoundError naming OpenVINO's or NNCF's module when either is missing, before
    anything imports ExecuTorch's OpenVINO package; then telemetry off."""
    import importlib.util

    for module in ("openvino", "nncf"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    _telemetry_off()


def _devices() -> tuple[str, ...]:
    """The devices this server's OpenVINO can compile for (``Core().available_devices``)."""
    import openvino

    return tuple(openvino.Core().available_devices)


def _partitioner_keys(devices: tuple[str, ...]) -> dict[str, SpecKey]:
    def device(value: str) -> str:
        if value not in devices:
            raise ValueError(f"{value!r} is not a device of this server: {', '.join(devices)}")
        return value

    return key_table(
        SpecKey(
            "device",
            str,
            "CPU",
            "OpenVINO device the partitions are compiled for (the compile spec's device); one "
            "this server has",
            devices,
            parse=device,
        ),
        list_key(
            "op_types_to_skip",
            "comma-separated operator types the partitioner reports as skipped "
            "(OpenvinoPartitioner's op_types_to_skip)",
        ),
        list_key(
            "op_names_to_skip",
            "comma-separated node names the partitioner reports as skipped "
            "(OpenvinoPartitioner's op_names_to_skip)",
        ),
    )


def compile_specs(spec: Mapping[str, SpecValue]) -> list[Any]:
    """The compile specs a validated ``openvino`` spec describes: ``[CompileSpec("device",
    DEVICE)]``, CPU by default, as ExecuTorch's ``OpenVINOTester`` builds them."""
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return [CompileSpec("device", str(spec.get("device", "CPU")).encode())]


def hosted() -> HostedPartitioner:
    """The hosted ``openvino`` partitioner (imports ExecuTorch's OpenVINO backend, OpenVINO and
    NNCF; raises if they cannot be imported)."""
    _require_toolchain()
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner

    keys = _partitioner_keys(_devices())

    def factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        kwargs: dict[str, Any] = {}
        for key in ("op_types_to_skip", "op_names_to_skip"):
            if key in spec:
                kwargs[key] = set(split_list(str(spec[key])))
        return OpenvinoPartitioner(compile_specs(spec), **kwargs)

    return HostedPartitioner(
        "openvino",
        "OpenvinoBackend",
        keys,
        factory,
        OpenvinoPartitioner,
        "OpenVINO: Intel CPUs, GPUs and NPUs (partitions compiled by OpenVINO on the server)",
    )


def hosted_quantizer() -> HostedQuantizer:
    """The hosted ``openvino`` quantizer: ``OpenVINOQuantizer(mode=QuantizationMode(mode))``,
    a fresh quantizer per call (``int8_sym`` by default, as ExecuTorch's ``openvino_int8``
    flow builds it); only the modes of :data:`QUANTIZER_MODES`."""
    _require_toolchain()
    from executorch.backends.openvino.quantizer.quantizer import (
        OpenVINOQuantizer,
        QuantizationMode,
    )

    from remote_partitioner.server.quantizers import HostedQuantizer

    def mode(value: str) -> Any:
        if value not in QUANTIZER_MODES:
            raise ValueError(f"{value!r} is not one of {', '.join(QUANTIZER_MODES)}")
        return QuantizationMode(value)

    keys = key_table(
        SpecKey(
            "mode",
            str,
            "int8_sym",
            "quantization mode: int8_sym (activations and weights symmetric), int8_mixed "
            "(asymmetric activations), int8_transformer (NNCF's transformer presets)",
            QUANTIZER_MODES,
            parse=mode,
        ),
    )

    def factory(spec: Mapping[str, SpecValue]) -> Quantizer:
        if "mode" in spec:
            return OpenVINOQuantizer(mode=mode(str(spec["mode"])))
        return OpenVINOQuantizer()

    return HostedQuantizer(
        "openvino",
        "OpenvinoBackend",
        keys,
        factory,
        OpenVINOQuantizer,
        "OpenVINO: NNCF's int8 post-training quantization (symmetric, mixed or transformer)",
    )


def hosted_backends() -> list[HostedBackend]:
    """The backend whose ``preprocess`` the server runs for ``openvino`` (the ``Preprocess``
    RPC): ExecuTorch's ``OpenvinoBackend``."""
    _require_toolchain()
    from executorch.backends.openvino.preprocess import OpenvinoBackend

    from remote_partitioner.server.backend_registry import HostedBackend

    return [HostedBackend(OpenvinoBackend, "ExecuTorch's OpenvinoBackend (compiled by OpenVINO)")]
