#!/usr/bin/env python3
"""`deploy/superlink-state.py --busy-timeout-ms MS [--busy-limit S] -- [flower-superlink] ARGS`: flower-superlink
whose SQLite state waits longer for its write lock.

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
Only SQLite's own busy error gets a 503: a `sqlite3.OperationalError` that the sqlite3 module raised with the
result code SQLITE_BUSY ("database is locked"), itself or wrapped by SQLAlchemy (`.orig`, `__cause__`); any
other error, whatever its text says, is Flower's. The 503s have an end: Flower retries them with no limit on
tries or time, so once the database has answered busy for `--busy-limit` seconds (default 60) with no write
going through since the first busy answer (`BusyStreak`; a write that succeeds ends the spell, a read does
not, since SQLite lets readers through a held write lock), the SuperLink logs one error naming the database
and answers as Flower does (its 500): the callers' retries end with an error, instead of waiting forever on
a lock that something else holds (a second SuperLink on the same file, a stuck backup).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import threading
import time
from typing import Callable

DEFAULT_BUSY_LIMIT_S = 60.0
# statements that need SQLite's write lock: one of them succeeding means the database is not held by another writer
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


def set_busy_timeout(milliseconds: int) -> None:
    """Make every SQLite connection Flower's SuperLink opens from now on wait up to `milliseconds` for a lock."""
    import flwr.supercore.sql_mixin as sql_mixin

    sql_mixin.SQLITE_PRAGMAS = tuple((name, str(milliseconds) if name == "busy_timeout" else value)
                                     for name, value in sql_mixin.SQLITE_PRAGMAS)


def is_busy_state(err: BaseException) -> bool:
    """Whether `err` is SQLite's busy error as the database layer raised it: a `sqlite3.OperationalError` with the
    result code SQLITE_BUSY (the sqlite3 module sets `sqlite_errorcode` on what it raises), itself or what it wraps
    (SQLAlchemy's `.orig`, a `__cause__`). Not text: any other exception saying "database is locked" is not it."""
    seen: set[int] = set()
    stack: list[object] = [err]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, sqlite3.OperationalError):
            code = getattr(current, "sqlite_errorcode", None)
            if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY:
                return True
        stack += [getattr(current, "orig", None), current.__cause__]
    return False


class BusyStreak:
    """How long the state database has answered busy with no write going through: the bound on its 503s.

    `busy()` is called for each busy answer and says whether it may still be a 503 (the spell is younger than
    `limit_s`); past it, it logs one error naming `database` (once per spell). `wrote()` ends the spell.
    """

    def __init__(self, limit_s: float = DEFAULT_BUSY_LIMIT_S, database: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s, self.database, self.clock = limit_s, database, clock
        self.lock = threading.Lock()
        self.since: float | None = None
        self.answers = 0
        self.reported = False

    def wrote(self) -> None:
        with self.lock:
            self.since, self.answers, self.reported = None, 0, False

    def busy(self) -> bool:
        now = self.clock()
        with self.lock:
            if self.since is None:
                self.since = now
            self.answers += 1
            age = now - self.since
            if age < self.limit_s:
                return True
            if not self.reported:
                self.reported = True
                name = f"the state database {self.database}" if self.database else "the state database"
                print(f"superlink-state.py: ERROR: {name} has been locked for {age:.0f} s ({self.answers} requests "
                      f"answered 'database is locked', no write through since the first), longer than --busy-limit "
                      f"{self.limit_s:g} s: answering as Flower does (HTTP 500) from now on, so the SuperNodes' and "
                      "the ServerApp's retries end. Find what holds its write lock (another flower-superlink or a "
                      "backup on the same file) and stop it.", file=sys.stderr, flush=True)
            return False


def busy_state_answers_503(translator, streak: BusyStreak | None = None):  # type: ignore[no-untyped-def]
    """Flower's HTTP error translator (a middleware's dispatch), answering a busy SQLite state with a retryable 503
    while `streak` allows it, and as Flower does after."""
    from fastapi.responses import JSONResponse

    bound = streak if streak is not None else BusyStreak()

    async def dispatch(request, call_next):  # type: ignore[no-untyped-def]
        async def guarded(inner_request):  # type: ignore[no-untyped-def]
            try:
                return await call_next(inner_request)
            except Exception as err:  # noqa: BLE001 - only a busy state is answered here; the rest goes on to Flower
                if not is_busy_state(err) or not bound.busy():
                    raise
                print(f"superlink-state.py: {request.url.path}: the state database is busy; answered 503, the "
                      "caller retries", file=sys.stderr, flush=True)
                return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                                    content={"detail": "The SuperLink's state database is busy; retry."})
        return await translator(request, guarded)

    return dispatch


def note_writes(streak: BusyStreak) -> Callable[..., None]:
    """Tell `streak` of every write statement that SQLAlchemy ran without error, on any engine (Flower's SQL
    stores); the listener, for `sqlalchemy.event.remove(Engine, "after_cursor_execute", listener)`."""
    from sqlalchemy import Engine, event

    def after_cursor_execute(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip()[:7].upper().startswith(WRITE_VERBS):
            streak.wrote()

    event.listen(Engine, "after_cursor_execute", after_cursor_execute)
    return after_cursor_execute


def database_of(flower_args: list[str]) -> str | None:
    """The `--database` that flower-superlink's arguments name, if any."""
    for index, arg in enumerate(flower_args):
        if arg == "--database" and index + 1 < len(flower_args):
            return flower_args[index + 1]
        if arg.startswith("--database="):
            return arg.split("=", 1)[1]
    return None


def answer_busy_state_with_503(streak: BusyStreak | None = None) -> None:
    """Install `busy_state_answers_503` where Flower's SuperLink builds its middleware (flwr/superlink/main.py)."""
    import flwr.superlink.main as superlink_main

    bound = streak if streak is not None else BusyStreak()
    note_writes(bound)
    superlink_main.http_error_translator = busy_state_answers_503(superlink_main.http_error_translator, bound)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="superlink-state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--busy-timeout-ms", type=int, required=True,
                        help="how long a SQLite connection waits for the write lock (Flower's own: 5000)")
    parser.add_argument("--busy-limit", type=float, default=DEFAULT_BUSY_LIMIT_S,
                        help="seconds of busy answers with no write through, after which they are Flower's 500 "
                             f"again (default {DEFAULT_BUSY_LIMIT_S:g})")
    parser.add_argument("flower_args", nargs=argparse.REMAINDER, help="-- then flower-superlink's arguments")
    args = parser.parse_args(argv)
    if args.busy_timeout_ms < 1:
        parser.error("--busy-timeout-ms must be a positive number of milliseconds")
    if not 0 < args.busy_limit <= 86400:
        parser.error("--busy-limit must be a number of seconds above 0 and at most 86400")
    flower_args = args.flower_args[1:] if args.flower_args[:1] == ["--"] else args.flower_args
    if flower_args[:1] == ["flower-superlink"]:  # the command as written (a Compose entrypoint gets it so)
        flower_args = flower_args[1:]
    set_busy_timeout(args.busy_timeout_ms)
    answer_busy_state_with_503(BusyStreak(args.busy_limit, database_of(flower_args)))
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *flower_args]
    flower_superlink()


if __name__ == "__main__":
    main()
