"""Serialized names for ``torch.return_types`` while the codec (de)serializes a program.

torch registers its structseq return types (``torch.return_types.median``, ``.max``,
``.topk``, ...) as pytree nodes *without* a serialized type name, so its export serializer
refuses a program whose output spec holds one (an operator returning values and indices,
exported as is): "No registered serialization name for <class 'torch.return_types.median'>".
Such a program is perfectly lowerable up to where ExecuTorch itself decides about it, so the
codec must carry it. :func:`return_type_names` names each of them
``torch.return_types.<name>`` for the duration of a block (their context is None, which JSON
holds), and restores torch's registry on leaving the last of nested or concurrent blocks, so
that nothing outside the codec (``torch.export.save`` in the caller's process) behaves
differently.
"""

from __future__ import annotations

import contextlib
from typing import Any

from remote_partitioner.proto.codec.shared_patch import SharedPatch

#: (class, the registry's entry before the block) of every name the block added.
_added: list[tuple[type, Any]] = []


def _install() -> None:
    import torch.return_types
    from torch.utils import _pytree as pytree

    for cls in torch.return_types.all_return_types:
        entry = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if entry is None or entry.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
            continue
        name = f"torch.return_types.{cls.__name__}"
        if name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            continue
        pytree.SUPPORTED_SERIALIZED_TYPES[cls] = entry._replace(serialized_type_name=name)
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls
        _added.append((cls, entry))


def _uninstall() -> None:
    from torch.utils import _pytree as pytree

    for cls, entry in _added:
        named = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if named is not None and named.serialized_type_name != entry.serialized_type_name:
            pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.pop(named.serialized_type_name, None)
            pytree.SUPPORTED_SERIALIZED_TYPES[cls] = entry
    _added.clear()


_return_type_names = SharedPatch(_install, _uninstall)


def return_type_names() -> contextlib.AbstractContextManager[None]:
    """Within the block, torch's structseq return types have serialized names (see the
    module docstring); visible to every thread while any block runs."""
    return _return_type_names()
