"""``python -m pyspark_jetstream.cli``: the ``jetstream`` command."""

import sys

from pyspark_jetstream.cli.command import main

sys.exit(main())
