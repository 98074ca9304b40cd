#!/usr/bin/env python3
"""`deploy/supernode-records.py --records-fd FD -- FLOWER_SUPERNODE ARGS`: Flower's SuperNode, with the records its
watchdog acts on written to a file descriptor of their own.

Why: a SuperNode's output is not only Flower's. Flower 1.42 starts its SuperExec and every ClientApp task with the
node's own stdout and stderr (`subprocess.Popen(command)` in flwr/supernode/start_client_internal.py and
flwr/supercore/superexec/executor/subprocess_executor.py), and marks neither its own lines nor theirs, so a
ClientApp can print any line Flower prints ("Server error '500 ...' for url '.../v1/fleet/pull-messages'",
"Failed to activate SuperNode"). deploy/retry-activation.sh therefore does not read the output at all: it reads
Flower's own log records, the ones Flower's logger (`flwr`) makes in this process, which no ClientApp reaches.

This launcher adds a handler to that logger and then runs FLOWER_SUPERNODE (the `flower-supernode` console
script) in this process with `runpy`, as its interpreter would. The handler writes one line to FD for each record
the watchdog acts on (`watchdog_line`):

- `deactivated STATUS PATH`: Flower logged, at ERROR, the `httpx.HTTPStatusError` that ended its connection to
  the SuperLink (flwr/supernode/fleet_http_connection.py, `log(ERROR, exc)` for an HTTP error on a `/v1/fleet/`
  request that Flower does not retry): it has deactivated the node, and its process lives on, serving nothing.
- `refused CODE`: Flower's exit record (`flwr_exit`, "Exit Code: CODE") says the SuperLink refused to activate
  the node ("Failed to activate SuperNode").

FD is made non-inheritable before Flower starts (and Flower's `subprocess.Popen` closes other fds anyway), so
the SuperExec and the ClientApp tasks never hold it. Standard library only; it runs with the Python of
`flower-supernode`'s environment (retry-activation.sh reads the console script's shebang).
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys

FLOWER_LOGGER = "flwr"


def http_error_of(record: logging.LogRecord) -> tuple[int, str] | None:
    """(status, url path) when the record's message is an HTTP status error object (httpx's), else None."""
    error = record.msg
    if not isinstance(error, Exception):
        return None
    try:  # httpx's `.request` raises when unset; only a real HTTPStatusError has both
        status = error.response.status_code  # type: ignore[attr-defined]
        path = str(error.request.url.path)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not an HTTP status error
        return None
    return (status, path) if isinstance(status, int) else None


def watchdog_line(record: logging.LogRecord) -> str | None:
    """The record as the watchdog reads it, or None for a record it does not act on."""
    if record.levelno < logging.ERROR:
        return None
    http_error = http_error_of(record)
    if http_error is not None:
        status, path = http_error
        return f"deactivated {status} {path}" if path.startswith("/v1/fleet/") else None
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is not one of Flower's exits
        return None
    words = message.split(maxsplit=3)
    if message.startswith("Exit Code: ") and len(words) > 2 and words[2].isdigit() \
            and "Failed to activate SuperNode" in message:
        return f"refused {words[2]}"
    return None


class WatchdogRecords(logging.Handler):
    """Writes `watchdog_line` of each of Flower's records to a file descriptor, one line each, at once."""

    def __init__(self, fd: int) -> None:
        super().__init__(logging.ERROR)
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        line = watchdog_line(record)
        if line is None:
            return
        try:
            os.write(self.fd, f"{line}\n".encode())
        except OSError:
            pass  # the watchdog is gone: the node runs on without it


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="supernode-records.py", description=__doc__.splitlines()[0])
    parser.add_argument("--records-fd", type=int, required=True, help="where the watchdog's records go")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then flower-supernode's path and arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no flower-supernode given (after --)")
    try:
        os.fstat(args.records_fd)
    except OSError:
        parser.error(f"--records-fd {args.records_fd} is not an open file descriptor")
    if args.records_fd <= 2:
        parser.error("--records-fd must not be stdin, stdout or stderr")
    os.set_inheritable(args.records_fd, False)
    logging.getLogger(FLOWER_LOGGER).addHandler(WatchdogRecords(args.records_fd))
    sys.argv = list(command)
    sys.path[0] = os.path.dirname(os.path.abspath(command[0]))  # what the console script's own sys.path starts with
    runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":
    main()
