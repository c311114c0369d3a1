"""A change to process-wide state that lasts while any codec block needs it.

The codec patches two things of torch's for the time it (de)serializes: the type hints the
schema deserializers ask for (``deserializers.schema_type_hints_memoized``) and the serialized
names of torch's structseq return types (``pytree_names.return_type_names``). Both must be in place
from the first of nested or concurrent blocks to the end of the last, and gone after it, so
that nothing outside the codec sees them. :class:`SharedPatch` is that bookkeeping, once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class SharedPatch:
    """A reference-counted patch: ``install`` runs when the first block is entered,
    ``uninstall`` when the last block is left (in whatever thread), each under one lock.

    Contract: ``install`` and ``uninstall`` do not raise in normal operation; if ``install``
    raises, the block is not entered and the count is unchanged (the next block tries again).
    While any block runs, the patch is visible to every thread of the process.
    """

    def __init__(self, install: Callable[[], None], uninstall: Callable[[], None]) -> None:
        self._install = install
        self._uninstall = uninstall
        self._lock = threading.Lock()
        self._users = 0

    @property
    def active(self) -> bool:
        """Whether a block is running now (the patch is installed)."""
        with self._lock:
            return self._users > 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._install()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._uninstall()
