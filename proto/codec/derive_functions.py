"""The ``derive_qparams_fn`` of the hosted quantizers' ``DerivedQuantizationSpec``s: each named
by the backend function's qualified name, and implemented here.

A derived spec's function runs on the client: ``convert_pt2e`` calls it on the observers of
the nodes the spec derives from (a bias's scale from its input's and weight's). The client has
torch and torchao, not the backend's packages, so a function crosses as a name and the client
runs this module's implementation of it: the same few tensor operations in the same order,
so the same bits (tests/test_arm.py compares each with the backend's own, in the backend's
environment, and the lowered ``.pte`` bytes).

On the server a function is accepted under its name only if it is a plain function that
captures nothing (no closure cells, no default values): Arm defines one of them inside a
method, so each call makes a new function object with the same code, and identity cannot be
the test. Nothing named on the wire is imported or evaluated on either side.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch

__all__ = ["DERIVE_FUNCTIONS", "captures_nothing"]


def _bias_qparams(
    obs_or_fqs: Sequence[Any], *, to_float32: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """A bias's qparams from its input's and weight's observers: scale = input scale x weight
    scale, zero point 0 (int32), as Arm's two bias functions compute them."""
    if len(obs_or_fqs) != 2:
        raise ValueError(
            "Expecting two obs/fqs, one for activation and one for weight, got: "
            f"{len(obs_or_fqs)}"
        )
    act_scale, _ = obs_or_fqs[0].calculate_qparams()
    weight_scale, _ = obs_or_fqs[1].calculate_qparams()
    scale = act_scale * weight_scale
    if to_float32:
        scale = scale.to(torch.float32)
    return scale, torch.full_like(weight_scale, fill_value=0, dtype=torch.int32)


def arm_bias_qparams(obs_or_fqs: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``executorch.backends.arm.quantizer.arm_quantizer_utils._derive_bias_qparams_fn``."""
    return _bias_qparams(obs_or_fqs, to_float32=False)


def arm_config_bias_qparams(obs_or_fqs: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``QuantizationConfig.get_bias_qspec``'s ``_derive_qparams_fn`` (Arm's quantization
    config): the same, the scale cast to float32."""
    return _bias_qparams(obs_or_fqs, to_float32=True)


_ARM = "executorch.backends.arm.quantizer"

#: The backend function's qualified name (``f"{fn.__module__}.{fn.__qualname__}"``) -> this
#: module's implementation of it.
DERIVE_FUNCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    f"{_ARM}.arm_quantizer_utils._derive_bias_qparams_fn": arm_bias_qparams,
    f"{_ARM}.quantization_config.QuantizationConfig.get_bias_qspec.<locals>._derive_qparams_fn":
        arm_config_bias_qparams,
})


def captures_nothing(fn: Any) -> bool:
    """Whether ``fn`` is a plain Python function without closure cells or default values:
    what it computes is its code alone."""
    return (
        isinstance(fn, types.FunctionType)
        and fn.__closure__ is None
        and not fn.__defaults__
        and not fn.__kwdefaults__
    )
