"""``python -m remote_partitioner.cli ...``: the ``remote-partitioner`` command line."""

import sys

from remote_partitioner.cli import main

sys.exit(main())
