"""The hosted Arm partitioners and quantizers: ExecuTorch's ``TOSAPartitioner`` (``arm_tosa``)
and ``EthosUPartitioner`` (``ethos_u55``, ``ethos_u85``, through the Vela compiler), their
compile specs' options as spec keys, and ``TOSAQuantizer`` / ``EthosUQuantizer``.

They need ``tosa-tools`` (``tosa_serializer``) and, for Ethos-U, ``ethos-u-vela``, which pin
numpy, flatbuffers and others exactly (ExecuTorch's ``executorch[ethos-u]`` extra). The Python
``flatbuffers`` version changes the bytes of every ``.pte`` ExecuTorch writes, so these
backends are hosted by a server in an environment of their own (``make venv-arm``), never
beside the others; in an environment without them this module's ``hosted()`` raises
``ModuleNotFoundError`` and the server leaves them out.

Every option a client sends is data: compile specs are built here, never from a path or a
command line the client wrote. Vela's configuration file is one of the files Vela ships
(``Arm/vela.ini``), and the extra Vela options a client may pass are an allow-list
(:data:`VELA_OPTIONS`); neither can name a file on the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from executorch.exir.backend.partitioner import Partitioner

from remote_partitioner.server.registry import (
    HostedPartitioner,
    InvalidSpecError,
    SpecKey,
    SpecValue,
    key_table,
)

if TYPE_CHECKING:
    from torchao.quantization.pt2e.quantizer import Quantizer

    from remote_partitioner.server.backend_registry import HostedBackend
    from remote_partitioner.server.quantizers import HostedQuantizer

#: The Ethos-U targets: hosted name, Vela's accelerator prefix, accepted MAC counts (as
#: ExecuTorch's ``get_u55_compile_spec``/``get_u85_compile_spec`` accept them), default MACs.
ETHOS_U_TARGETS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "ethos_u55": ("ethos-u55", (32, 64, 128, 256), 128),
    "ethos_u85": ("ethos-u85", (128, 256, 512, 1024, 2048), 128),
}

#: The Vela configuration files a client may name: those Vela ships (relative to its
#: ``config_files`` folder, as ExecuTorch's ``EthosUCompileSpec`` names its default).
VELA_CONFIG_FILES: tuple[str, ...] = ("Arm/vela.ini",)

#: The Vela command-line options a client may add (``extra_flags``), and what each takes: a
#: parser for its value, or ``None`` for a flag without one. Options that read or write files,
#: print reports or change the output format are not among them (``--output-format`` only as
#: ``raw``, the format ExecuTorch reads).
VELA_OPTIONS: dict[str, Callable[[str], object] | None] = {}


def _int_at_least(low: int) -> Callable[[str], object]:
    def parse(value: str) -> object:
        number = int(value)
        if number < low:
            raise ValueError(f"{value} is below {low}")
        return number

    return parse


def _choice(accepted: tuple[str, ...]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in accepted:
            raise ValueError(f"{value!r} is not one of {', '.join(accepted)}")
        return value

    return parse


VELA_OPTIONS.update(
    {
        "--arena-cache-size": _int_at_least(0),
        "--cpu-tensor-alignment": _int_at_least(1),
        "--max-block-dependency": _int_at_least(0),
        "--recursion-limit": _int_at_least(1),
        "--hillclimb-max-iterations": _int_at_least(1),
        "--optimise": _choice(("Size", "Performance")),
        "--tensor-allocator": _choice(("LinearAlloc", "Greedy", "HillClimb")),
        "--output-format": _choice(("raw",)),
        "--force-symmetric-int-weights": None,
        "--disable-chaining": None,
        "--disable-fwd": None,
        "--disable-cascading": None,
        "--disable-buffering": None,
        "--disable-ifm-reuse": None,
        "--separate-io-regions": None,
    }
)


def parse_vela_flags(value: str) -> list[str]:
    """The space-separated Vela options of a client's ``extra_flags``, in its order (the
    order is part of the compile spec, hence of the ``.pte``).

    Each item is ``--option=value`` or ``--flag`` from :data:`VELA_OPTIONS`; the builder's own
    options (``--accelerator-config``, ``--config``, ``--system-config``, ``--memory-mode``)
    come from their spec keys.

    Raises:
        ValueError: naming the item and the accepted options.
    """
    flags = value.split()
    for flag in flags:
        option, sep, argument = flag.partition("=")
        if option not in VELA_OPTIONS:
            raise ValueError(
                f"{flag!r} is not an accepted Vela option; accepted: {', '.join(VELA_OPTIONS)}"
            )
        parse = VELA_OPTIONS[option]
        if parse is None:
            if sep:
                raise ValueError(f"{option} takes no value, got {flag!r}")
            continue
        if not sep or not argument:
            raise ValueError(f"{option} takes a value: {option}=VALUE")
        try:
            parse(argument)
        except ValueError as e:
            raise ValueError(f"{flag!r}: {e}") from None
    return flags


def _require_toolchain() -> None:
    """ModuleNotFoundError naming tosa-tools' or Vela's module when either is missing, before
    anything imports ExecuTorch's Arm package (whose partial import in an environment without
    them writes torch's warnings straight to stderr, past the server's logging)."""
    import importlib.util

    for module in ("tosa_serializer", "ethosu"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def _tosa_spec(value: str) -> Any:
    from executorch.backends.arm.tosa import TosaSpecification

    try:
        return TosaSpecification.create_from_string(value)
    except Exception as e:
        raise ValueError(f"{value!r} is not a TOSA specification (e.g. TOSA-1.0+FP): {e}") from None


def _vela_sections(kind: str) -> tuple[str, ...]:
    """The ``[kind.NAME]`` section names of Vela's shipped ``Arm/vela.ini``."""
    import configparser
    from importlib.resources import files

    parser = configparser.ConfigParser()
    parser.read_string(files("ethosu").joinpath("config_files/Arm/vela.ini").read_text())
    prefix = kind + "."
    return tuple(s[len(prefix) :] for s in parser.sections() if s.startswith(prefix))


def _tosa_keys(default: str = "TOSA-1.0+FP") -> dict[str, SpecKey]:
    return key_table(
        SpecKey(
            "tosa_spec",
            str,
            default,
            "TOSA specification to lower for, e.g. TOSA-1.0+FP or TOSA-1.0+INT (extensions: "
            "+int16, +int4, +bf16, +fp8e4m3, +fp8e5m2, ...)",
            parse=_tosa_spec,
        ),
    )


def _ethos_u_keys(name: str) -> dict[str, SpecKey]:
    prefix, macs, default_macs = ETHOS_U_TARGETS[name]
    systems, modes = _vela_sections("System_Config"), _vela_sections("Memory_Mode")

    def parse_macs(value: int) -> int:
        if value not in macs:
            raise ValueError(f"{value} is not one of {', '.join(map(str, macs))}")
        return value

    return key_table(
        SpecKey(
            "macs",
            int,
            default_macs,
            f"MACs per cycle: Vela's accelerator {prefix}-MACS ({', '.join(map(str, macs))})",
            parse=parse_macs,
        ),
        SpecKey(
            "system_config",
            str,
            None,
            "Vela system configuration (a System_Config section of the configuration file); "
            "default ExecuTorch's for the target",
            systems,
            parse=_choice(systems),
        ),
        SpecKey(
            "memory_mode",
            str,
            None,
            "Vela memory mode (a Memory_Mode section of the configuration file); "
            "default ExecuTorch's for the target",
            modes,
            parse=_choice(modes),
        ),
        SpecKey(
            "extra_flags",
            str,
            None,
            "space-separated extra Vela options, kept in order, e.g. "
            "--arena-cache-size=2097152 (an allow-list: see docs/backends.md)",
            parse=parse_vela_flags,
        ),
        SpecKey(
            "config_ini",
            str,
            VELA_CONFIG_FILES[0],
            "Vela configuration file, one Vela ships",
            VELA_CONFIG_FILES,
            parse=_choice(VELA_CONFIG_FILES),
        ),
    )


def tosa_compile_spec(spec: Mapping[str, SpecValue], default: str = "TOSA-1.0+FP") -> Any:
    """The ``TosaCompileSpec`` a validated ``arm_tosa`` spec describes (``default`` when it
    names no ``tosa_spec``)."""
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    return TosaCompileSpec(str(spec.get("tosa_spec", default)))


def ethos_u_compile_spec(name: str, spec: Mapping[str, SpecValue]) -> Any:
    """The ``EthosUCompileSpec`` a validated ``ethos_u55``/``ethos_u85`` spec describes: the
    arguments ExecuTorch's ``EthosUCompileSpec`` takes, those the client did not send left to
    its defaults."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    prefix, _, default_macs = ETHOS_U_TARGETS[name]
    kwargs: dict[str, Any] = {}
    for key in ("system_config", "memory_mode", "config_ini"):
        if key in spec:
            kwargs[key] = spec[key]
    if "extra_flags" in spec:
        kwargs["extra_flags"] = parse_vela_flags(str(spec["extra_flags"]))
    macs = spec.get("macs", default_macs)
    assert isinstance(macs, int)  # validated: an int key
    return EthosUCompileSpec(f"{prefix}-{macs}", **kwargs)


def _compile_spec_builder(
    name: str, tosa_default: str = "TOSA-1.0+FP"
) -> Callable[[Mapping[str, SpecValue]], Any]:
    if name == "arm_tosa":
        return lambda spec: tosa_compile_spec(spec, tosa_default)
    return lambda spec: ethos_u_compile_spec(name, spec)


def _built(name: str, build: Callable[[Mapping[str, SpecValue]], Any], spec: Any) -> Any:
    # ExecuTorch validates combinations (e.g. an Ethos-U55 target with a non-U55 TOSA
    # subset) when it builds the compile spec: a ValueError there is the client's spec.
    try:
        return build(spec)
    except ValueError as e:
        key = next(iter(spec), "")
        raise InvalidSpecError(key, "", f"{name}: {e}") from e


def hosted() -> list[HostedPartitioner]:
    """The hosted ``arm_tosa``, ``ethos_u55`` and ``ethos_u85`` partitioners (import
    ExecuTorch's Arm backend, tosa-tools and Vela; raise if they cannot be imported)."""
    _require_toolchain()
    import ethosu.vela  # noqa: F401  (Vela: Ethos-U's preprocess calls it)
    from executorch.backends.arm.ethosu import EthosUPartitioner
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    hosted: list[HostedPartitioner] = []
    tosa_keys = _tosa_keys()

    def tosa_factory(spec: Mapping[str, SpecValue]) -> Partitioner:
        return TOSAPartitioner(_built("arm_tosa", tosa_compile_spec, spec))

    hosted.append(
        HostedPartitioner(
            "arm_tosa",
            "TOSABackend",
            tosa_keys,
            tosa_factory,
            TOSAPartitioner,
            "Arm TOSA: a TOSA flatbuffer (FP or INT profile) for any TOSA runtime",
        )
    )
    for name in ETHOS_U_TARGETS:
        build = _compile_spec_builder(name)

        def ethos_factory(
            spec: Mapping[str, SpecValue],
            name: str = name,
            build: Callable[[Mapping[str, SpecValue]], Any] = build,
        ) -> Partitioner:
            return EthosUPartitioner(_built(name, build, spec))

        hosted.append(
            HostedPartitioner(
                name,
                "EthosUBackend",
                _ethos_u_keys(name),
                ethos_factory,
                EthosUPartitioner,
                f"Arm {name.replace('_', '-').title()}: INT8 NPU command streams compiled by Vela",
            )
        )
    return hosted


def _quantization_keys() -> dict[str, SpecKey]:
    def int_range(low: int, high: int) -> Callable[[int], int]:
        def parse(value: int) -> int:
            if not low <= value <= high:
                raise ValueError(f"{value} is not in {low}..{high}")
            return value

        return parse

    return key_table(
        SpecKey("is_per_channel", bool, True, "weights per output channel, not per tensor"),
        SpecKey("is_qat", bool, False, "fake-quantize config for quantization-aware training"),
        SpecKey("is_dynamic", bool, False, "dynamic: activations quantized at run time"),
        SpecKey("act_qmin", int, -128, "activation quant_min", parse=int_range(-128, 127)),
        SpecKey("act_qmax", int, 127, "activation quant_max", parse=int_range(-128, 127)),
        SpecKey("weight_qmin", int, -127, "weight quant_min", parse=int_range(-128, 127)),
        SpecKey("weight_qmax", int, 127, "weight quant_max", parse=int_range(-128, 127)),
        SpecKey("io", bool, False, "also quantize the program's inputs and outputs (set_io)"),
    )


_INT_PROFILE = "TOSA-1.0+INT"

#: The quantization configuration's keys: the arguments of ExecuTorch's Arm
#: ``get_symmetric_quantization_config``, in its parameter order.
_CONFIG_KEYS = (
    "is_per_channel",
    "is_qat",
    "is_dynamic",
    "act_qmin",
    "act_qmax",
    "weight_qmin",
    "weight_qmax",
)


def hosted_quantizer() -> list[HostedQuantizer]:
    """The hosted ``arm_tosa``, ``ethos_u55`` and ``ethos_u85`` quantizers: the quantizer
    ExecuTorch's ``create_quantizer`` makes for the target's compile spec (``TOSAQuantizer``,
    ``EthosUQuantizer``), with ``set_global(get_symmetric_quantization_config(**config))``, and
    ``set_io`` with the same configuration when ``io`` is true, as ExecuTorch's Arm test flows
    build it. The spec keys are the partitioner's (the compile spec) and the configuration
    function's arguments (sent keyword by keyword, in its parameter order; absent keys take
    its defaults, per channel by default)."""
    _require_toolchain()
    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.backends.arm.util._factory import create_quantizer

    from remote_partitioner.server.quantizers import HostedQuantizer

    quantizers: list[HostedQuantizer] = []
    for name in ("arm_tosa", *ETHOS_U_TARGETS):
        # Quantizing is for an integer profile: arm_tosa's quantizer defaults to TOSA-1.0+INT.
        target_keys = _tosa_keys(_INT_PROFILE) if name == "arm_tosa" else _ethos_u_keys(name)
        keys = {**target_keys, **_quantization_keys()}
        build = _compile_spec_builder(name, _INT_PROFILE)

        def factory(
            spec: Mapping[str, SpecValue],
            name: str = name,
            build: Callable[[Mapping[str, SpecValue]], Any] = build,
            target_keys: Mapping[str, SpecKey] = target_keys,
        ) -> Quantizer:
            compile_spec = _built(name, build, {k: v for k, v in spec.items() if k in target_keys})
            quantizer = create_quantizer(compile_spec)
            config = get_symmetric_quantization_config(
                **{k: spec[k] for k in _CONFIG_KEYS if k in spec}
            )
            quantizer.set_global(config)
            if spec.get("io", False):
                quantizer.set_io(config)
            return quantizer

        quantizers.append(
            HostedQuantizer(
                name,
                "TOSABackend" if name == "arm_tosa" else "EthosUBackend",
                keys,
                factory,
                TOSAQuantizer if name == "arm_tosa" else EthosUQuantizer,
                f"Arm {name}: symmetric int8 PT2E quantization for the target's TOSA profile",
                # executorch.backends.arm.quantizer imports executorch.kernels.quantized
                loads_quantized_kernels=True,
            )
        )
    return quantizers


def hosted_backends() -> list[HostedBackend]:
    """The backends whose ``preprocess`` the server runs for the Arm partitioners (the
    ``Preprocess`` RPC): ExecuTorch's ``TOSABackend`` (``arm_tosa``: serializes the TOSA
    flatbuffer) and ``EthosUBackend`` (``ethos_u55``, ``ethos_u85``: the TOSA flatbuffer
    compiled by Vela, in a temporary folder Vela's caller removes; what Vela prints goes to the
    server's log at DEBUG, as all backend output during a call does)."""
    _require_toolchain()
    from executorch.backends.arm.ethosu.backend import EthosUBackend
    from executorch.backends.arm.tosa.backend import TOSABackend

    from remote_partitioner.server.backend_registry import HostedBackend

    return [
        HostedBackend(TOSABackend, "ExecuTorch's TOSABackend (tosa-tools' serializer)"),
        HostedBackend(EthosUBackend, "ExecuTorch's EthosUBackend (TOSA compiled by Vela)"),
    ]
