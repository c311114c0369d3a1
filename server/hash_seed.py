"""Python's string hash seed, which some backends' lowerings depend on.

ExecuTorch's Arm ``TOSAPartitioner`` (1.5.1; ``arm_tosa``, ``ethos_u55``, ``ethos_u85``)
collects its partition tags in a ``set`` of strings and returns ``partition_tags`` in that set's
order (pytorch/executorch#19045). ExecuTorch lowers the partitions in that order, and the order
decides the node order of the lowered graph and so the delegates' inputs and outputs: a program
with two or more Arm partitions (an ``AdaptiveAvgPool2d`` Arm decomposes into slices is enough)
lowers to different ``.pte`` bytes in processes with different hash seeds, locally as well as on
a server. A set of strings iterates in an order decided by ``PYTHONHASHSEED``, which Python
draws at random per process unless it is set.

So a server runs with a fixed seed, as a reproducible build does: ``serve`` started without
``PYTHONHASHSEED`` in its environment restarts itself (``exec``, the same process) with
``PYTHONHASHSEED=0`` (:func:`restart_with_fixed_seed`). Every replica, and every restart,
then answers alike, the result cache's entries hold for all of them, and a local lowering run
with ``PYTHONHASHSEED=0`` gives the bytes the server gives. An operator who sets
``PYTHONHASHSEED`` (another number, or ``random``) keeps it. ``ListPartitioners`` reports the
seed (``ServerVersions.python_hash_seed``, :func:`current_seed`), and the result cache keys on
it with the other versions.

A fixed seed gives up Python's defence against crafted hash collisions (many strings with one
hash make dict and set operations quadratic); the server's limits on program bytes and nodes
bound what one call can send, and its token or TLS settings who may send it.
"""

from __future__ import annotations

import os
import sys

#: The seed a server runs with unless its operator sets ``PYTHONHASHSEED``: "0", the value
#: reproducible builds use (hash randomization off).
FIXED_SEED = "0"

#: The environment variable Python reads its seed from, at start only.
VARIABLE = "PYTHONHASHSEED"


def current_seed() -> str:
    """This process's string hash seed: ``"0"`` when randomization is off, the number it was
    started with (``PYTHONHASHSEED``), or ``"random"``.

    Read from ``sys.flags`` first: an interpreter started with ``-E`` or ``-I`` ignored the
    variable, whatever ``os.environ`` says now.
    """
    if not sys.flags.hash_randomization:
        return "0"
    value = os.environ.get(VARIABLE, "")
    if sys.flags.ignore_environment or not value.isdigit():
        return "random"
    return value


def restart_with_fixed_seed() -> None:
    """Replace this process with itself started with ``PYTHONHASHSEED`` =
    :data:`FIXED_SEED`, unless the variable is set already (to any value: the operator's
    choice, and no loop).

    Call it only from a process that runs nothing but a command line (``serve``, the
    conformance runner), before it starts threads or opens anything it would need after:
    ``exec`` keeps the process id, its open standard streams and its arguments
    (``sys.orig_argv``, interpreter options included), and nothing else. Does not return when
    it restarts; raises ``OSError`` when the interpreter cannot be executed.
    """
    if os.environ.get(VARIABLE) or sys.flags.ignore_environment:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, VARIABLE: FIXED_SEED})
