#!/usr/bin/env python3
"""`deploy/superlink-state.py --busy-timeout-ms MS -- [flower-superlink] ARGS`: flower-superlink whose SQLite
state waits longer for its write lock.

With `--database FILE`, Flower 1.42's SuperLink keeps every message's objects (a reply's arrays, in
chunks of at most 5 MB) in that SQLite file, one write transaction per pushed object, and each of its
connections waits at most 5 s for the write lock (`busy_timeout` in flwr/supercore/constant.py
`SQLITE_PRAGMAS`, not configurable). On a loaded host, resnet18-sized replies (~45 MB) from three
sites at once hold the lock longer: a push then fails with `database is locked` (HTTP 500), which the
SuperNode does not retry, and the round waits out its timeout
(benchmarks/superlink_state_lock.py measured 4 such failures in 2 rounds at 5 s, twice, slowest 9.7 s;
none at 60 s, slowest 17 s and 33 s in two tries). This launcher sets the busy timeout Flower's connections get, then runs
Flower's own `flower-superlink` entry point with the arguments after `--` (and after the word
`flower-superlink`, when given, as docker-compose.yml's entrypoint passes the service's command);
deploy/superlink.sh runs it
(with the Python of `flower-superlink`'s environment) when the state is a file. It imports Flower only,
so it runs from this folder without the project installed.

Where a lock is still not had in time, the request's answer is `503 Service Unavailable` with `Retry-After: 1`
instead of Flower's 500 (`busy_state_answers_503`): a SuperNode retries a 502, 503 or 504 with backoff
(flwr/supercore/retry/http_retry.py) but gives up on a 500, so a busy state now delays a push or a pull instead of
losing a site's reply (or, on a pull, leaving the node deactivated: deploy/retry-activation.sh's watchdog).
"""

from __future__ import annotations

import argparse
import sys


def set_busy_timeout(milliseconds: int) -> None:
    """Make every SQLite connection Flower's SuperLink opens from now on wait up to `milliseconds` for a lock."""
    import flwr.supercore.sql_mixin as sql_mixin

    sql_mixin.SQLITE_PRAGMAS = tuple((name, str(milliseconds) if name == "busy_timeout" else value)
                                     for name, value in sql_mixin.SQLITE_PRAGMAS)


def is_busy_state(err: BaseException) -> bool:
    """Whether `err` (or what it wraps: SQLAlchemy's `.orig`, a `__cause__`) is SQLite's "database is locked"."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if "database is locked" in str(current) or "database is busy" in str(current):
            return True
        stack += [getattr(current, "orig", None), current.__cause__, current.__context__]
    return False


def busy_state_answers_503(translator):  # type: ignore[no-untyped-def]
    """Flower's HTTP error translator (a middleware's dispatch), answering a busy SQLite state with a retryable 503."""
    from fastapi.responses import JSONResponse

    async def dispatch(request, call_next):  # type: ignore[no-untyped-def]
        async def guarded(inner_request):  # type: ignore[no-untyped-def]
            try:
                return await call_next(inner_request)
            except Exception as err:  # noqa: BLE001 - only a busy state is answered here; the rest goes on to Flower
                if not is_busy_state(err):
                    raise
                print(f"superlink-state.py: {request.url.path}: the state database is busy; answered 503, the "
                      "caller retries", file=sys.stderr, flush=True)
                return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                                    content={"detail": "The SuperLink's state database is busy; retry."})
        return await translator(request, guarded)

    return dispatch


def answer_busy_state_with_503() -> None:
    """Install `busy_state_answers_503` where Flower's SuperLink builds its middleware (flwr/superlink/main.py)."""
    import flwr.superlink.main as superlink_main

    superlink_main.http_error_translator = busy_state_answers_503(superlink_main.http_error_translator)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="superlink-state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--busy-timeout-ms", type=int, required=True,
                        help="how long a SQLite connection waits for the write lock (Flower's own: 5000)")
    parser.add_argument("flower_args", nargs=argparse.REMAINDER, help="-- then flower-superlink's arguments")
    args = parser.parse_args(argv)
    if args.busy_timeout_ms < 1:
        parser.error("--busy-timeout-ms must be a positive number of milliseconds")
    flower_args = args.flower_args[1:] if args.flower_args[:1] == ["--"] else args.flower_args
    if flower_args[:1] == ["flower-superlink"]:  # the command as written (a Compose entrypoint gets it so)
        flower_args = flower_args[1:]
    set_busy_timeout(args.busy_timeout_ms)
    answer_busy_state_with_503()
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *flower_args]
    flower_superlink()


if __name__ == "__main__":
    main()
