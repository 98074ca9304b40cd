"""Stand-in `flower-supernode` console scripts for the watchdog's tests (deploy/retry-activation.sh).

Python scripts that log through Flower's logger (`flwr`) as Flower 1.42's SuperNode does, so that
deploy/supernode-records.py reads their records exactly as it reads Flower's own, and that print to stdout and
stderr what a ClientApp passed through the node's output could print.
"""

from __future__ import annotations

import sys
from pathlib import Path

PRELUDE = (f"#!{sys.executable}\n"
           "import logging, os, signal, sys, time\n"
           "FLOWER = logging.getLogger('flwr')\n")

# Flower's records, as flwr/supercore/exit/exit.py and flwr/supernode/fleet_http_connection.py make them
REFUSED = ("FLOWER.error('Exit Code: 305\\nFailed to initialize the connection to the SuperLink.\\n'\n"
           "             '[code: 3] Failed to activate SuperNode.')\n"
           "print('Failed to activate SuperNode.')\n"
           "sys.exit(1)\n")


def left_offline(url: str = "https://127.0.0.1:9092/v1/fleet/pull-messages", status: int = 500) -> str:
    """The record Flower logs when an HTTP error it does not retry ends its connection: `log(ERROR, exc)`."""
    return ("import httpx\n"
            f"request = httpx.Request('POST', {url!r})\n"
            f"response = httpx.Response({status}, request=request)\n"
            "FLOWER.error(httpx.HTTPStatusError(f\"Server error '{response.status_code} Internal Server Error' \"\n"
            f"                                  f\"for url '{url}'\", request=request, response=response))\n")


def write(bin_dir: Path, body: str) -> Path:
    """`bin_dir/flower-supernode` running `body` after PRELUDE; each start appends a line to `bin_dir/calls`
    (the body sees the start's number as `CALL`). Returns the calls file."""
    bin_dir.mkdir(exist_ok=True)
    calls = bin_dir / "calls"
    script = bin_dir / "flower-supernode"
    script.write_text(PRELUDE + f"with open({str(calls)!r}, 'a') as out:\n    out.write('x\\n')\n"
                      f"CALL = len(open({str(calls)!r}).read().splitlines())\n" + body)
    script.chmod(0o755)
    return calls
