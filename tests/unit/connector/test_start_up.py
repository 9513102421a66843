"""What importing the connector costs the processes that only plan and hold the link.

Spark starts a streaming runner (and a planner) process for every query; each imports the data
source before it can do anything, so what the import pulls in is paid at every query's start.
"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_connector_imports_neither_pandas_nor_arrows_compute_functions() -> None:
    """pandas takes ~0.3 s to import and pyarrow.compute ~0.1 s, and the runner needs neither
    (Arrow imports pandas on its first ``pa.array`` of Python objects, so no module may build
    one at import)."""
    probe = (
        "import sys, sluicegate.spark.queue_source; "
        "print(sorted({'pandas', 'pyarrow.compute'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
