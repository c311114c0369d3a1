"""The project's scripts (``scripts/``) as modules, for the tests that call their functions."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def conformance_script() -> ModuleType:
    """``scripts/conformance.py`` (the runner, its log readers and its normalizations), loaded
    once per process."""
    path = ROOT / "scripts" / "conformance.py"
    spec = importlib.util.spec_from_file_location("rp_conformance_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module
