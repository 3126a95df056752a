"""``python -m rnstensor``: the command line of :mod:`rnstensor.cli`."""

import sys

from .cli import main

sys.exit(main())
