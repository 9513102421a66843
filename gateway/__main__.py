"""``python -m gateway``: the server on its embedded defaults, like ``sluicegate serve``."""

import sys

from gateway.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
