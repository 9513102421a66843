"""``python -m bench``: run one benchmark scenario (see ``bench.cli``)."""

import sys

from bench.cli import main

sys.exit(main())
