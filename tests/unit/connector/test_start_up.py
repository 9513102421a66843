"""What importing the connector costs the processes that only plan and hold the link.

Spark starts a streaming runner (and a planner) process for every query; each imports the data
source before it can do anything, so what the import pulls in is paid at every query's start.
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_connector_does_not_import_pandas() -> None:
    """pandas takes ~0.3 s to import and the runner never needs it (Arrow imports it on its
    first ``pa.array`` of Python objects, so no module may build one at import)."""
    probe = "import sys, sluicegate.spark.queue_source; print('pandas' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
