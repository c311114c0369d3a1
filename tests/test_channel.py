"""``client.channel`` sets gRPC's ring-hash environment variable when a channel needs it, not
when it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remote_partitioner.client.channel import RING_HASH_ENV


def _run(code: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k != RING_HASH_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env={**clean, **env})
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


_PRELUDE = (
    "import json, os\n"
    "import remote_partitioner.client\n"
    "import remote_partitioner.client.cli\n"
    "from remote_partitioner.client import channel\n"
    f"before = os.environ.get({RING_HASH_ENV!r})\n"
)


def test_import_leaves_the_environment_alone_first_channel_sets_it() -> None:
    code = _PRELUDE + (
        "channel.open_channel('127.0.0.1:1').close()\n"
        f"print(json.dumps({{'before': before, 'after': os.environ.get({RING_HASH_ENV!r}), "
        "'affinity': channel.HEADER_AFFINITY}))\n"
    )
    assert _run(code) == {"before": None, "after": "true", "affinity": True}


def test_a_value_the_user_set_is_kept() -> None:
    code = _PRELUDE + (
        "options = dict(channel.DEFAULT_CHANNEL_OPTIONS)\n"
        "policies = [next(iter(p)) for p in "
        "json.loads(options['grpc.service_config'])['loadBalancingConfig']]\n"
        f"print(json.dumps({{'after': os.environ.get({RING_HASH_ENV!r}), "
        "'affinity': channel.HEADER_AFFINITY, 'policies': policies}))\n"
    )
    assert _run(code, **{RING_HASH_ENV: "false"}) == {
        "after": "false", "affinity": False, "policies": ["pick_first"]}
