"""``python -m sluicegate``: the ``sluicegate`` command; with no subcommand, ``serve``.

So ``python -m sluicegate`` alone runs the server on its embedded defaults, and
``python -m sluicegate --listen 127.0.0.1:0`` and ``python -m sluicegate serve ...`` both serve.
"""

import sys

from sluicegate.cli.main import main

args = sys.argv[1:]
if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
    args = ["serve", *args]
sys.exit(main(args))
