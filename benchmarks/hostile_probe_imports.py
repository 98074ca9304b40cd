"""The hostile probe's import and message-value families (benchmarks/hostile_probe.py), judged by docs/own-data.md
("Which packages a site imports") and docs/library.md ("What each strategy sends and expects").

- imports: a run config's `algorithm` or `model` import path outside the packages a site permits is refused before
  import, on the server (`server_app.app.main`) and on a node (the ClientApp's handshake), naming the site, the key
  and the path; a module that would write a marker file when imported leaves none. A permitted module raising
  SystemExit or KeyboardInterrupt on import is refused naming its path; a malformed allow-list is refused naming the
  setting; a listed dotted package does not permit its siblings; a permitted plugin whose row names a module outside
  the list is refused naming that module; `fedsynth run` exits 2 naming a module that exits on import.
- message values: train messages to fedsynth's ClientApp whose config holds a bad value for a setting the node
  reads (NaN, negative, text for a number, an unknown codec, a missing round): refused naming the key, or silently
  wrong when the node trains on it.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from hostile_probe import HANDLED, WRONG, Case, Verdict, refused_naming

MODULE = '''
from pathlib import Path
Path({marker!r}).write_text("imported")
{tail}
X = 1
'''


def write_module(work: Path, name: str, tail: str = "") -> Path:
    """A module `name` in work/probe-modules that writes work/NAME.imported when imported, then runs `tail`."""
    folder = work / "probe-modules"
    folder.mkdir(exist_ok=True)
    marker = work / f"{name}.imported"
    (folder / f"{name}.py").write_text(MODULE.format(marker=str(marker), tail=tail))
    return marker


def on_server(raw: dict) -> object:
    from flwr.app import Context, RecordDict

    from server_app.app import main

    return main(None, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=raw))


def on_node(raw: dict, node_config: dict | None = None) -> object:
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import app

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    config = {"partition-id": 0, "num-partitions": 2, **(node_config or {})}
    context = Context(run_id=1, node_id=7, node_config=config, state=RecordDict(), run_config=raw)
    return app(Message(RecordDict(), dst_node_id=7, message_type="query.handshake"), context)


def refused_unimported(call, names: tuple[str, ...], marker: Path | None = None, module: str = "") -> Verdict:
    """Refused naming `names`, and neither the marker written nor `module` in sys.modules (imported anyway)."""
    outcome, detail = refused_naming(call, names)
    if (marker is not None and marker.exists()) or (module and module in sys.modules):
        return WRONG, f"imported although refused: {detail}"
    return outcome, detail


def import_cases(work: Path) -> list[Case]:
    sys.path.insert(0, str(work / "probe-modules"))  # not a Flower app: only what a case lists is permitted
    cases = []
    for side, run in (("server", on_server), ("node", on_node)):
        for key in ("algorithm", "model"):
            site = "the ServerApp" if side == "server" else "node 7"
            cases.append(Case("imports", f"{side}: {key} = 'antigravity:X'", lambda r=run, k=key, s=site:
                              refused_unimported(lambda: r({k: "antigravity:X"}), (s,), module="antigravity")))
            marker = write_module(work, f"probe_marker_{side}_{key}")
            path = f"probe_marker_{side}_{key}:X"
            cases.append(Case("imports", f"{side}: {key} = a module outside the list (marker stays absent)",
                              lambda r=run, k=key, p=path, m=marker, s=site:
                              refused_unimported(lambda: r({k: p}), (s,), marker=m)))
        for raised in ("SystemExit(3)", "SystemExit(0)", "KeyboardInterrupt()"):
            name = f"probe_exit_{side}_{raised.split('(')[0].lower()}_{raised[-2] if raised[-2].isdigit() else 'k'}"
            write_module(work, name, f"raise {raised}")
            cases.append(Case("imports", f"{side}: a permitted module raising {raised} on import",
                              lambda r=run, n=name, sd=side: permitted_exit(r, n, sd)))
    for value in ("../evil", "*", "os;rm", 5, "a" * 20000):
        cases.append(Case("imports", f"node: allowed-imports = {str(value)[:20]!r}",
                          lambda v=value: refused_naming(lambda: on_node({"model": "mlp"}, {"allowed-imports": v}),
                                                         ("allowed-imports",))))
    cases.append(Case("imports", "server: FEDSYNTH_ALLOWED_IMPORTS = '../evil'", lambda: env_refused("../evil")))
    for path in ("os:system", "subprocess:run", "builtins:eval", "importlib:import_module", ".relative:X",
                 "a/b:X", "x:y:z", "probe_sibling.other:X"):
        cases.append(Case("imports", f"node: model = {path!r} (listed: probe_sibling.models)", lambda p=path:
                          refused_naming(lambda: on_node({"model": p}, {"allowed-imports": "probe_sibling.models"}),
                                         (p, "import path"))))
    write_plugin(work)
    cases.append(Case("imports", "server: a permitted plugin whose strategy is 'os:system'",
                      lambda: permitted_plugin_refused()))
    cases.append(Case("imports", "cli: fedsynth run with a module that exits on import", lambda: cli_exit(work),
                      timeout=90))
    return cases


def permitted_exit(run, name: str, side: str) -> Verdict:
    """A permitted module that ends the process on import: refused naming its path, the process still here."""
    raw = {"algorithm": f"{name}:X"}
    if side == "server":
        os.environ["FEDSYNTH_ALLOWED_IMPORTS"] = name
        return refused_naming(lambda: run(raw), (f"{name}:X",))
    return refused_naming(lambda: run(raw, {"allowed-imports": name}), (f"{name}:X",))


def env_refused(value: str) -> Verdict:
    os.environ["FEDSYNTH_ALLOWED_IMPORTS"] = value
    return refused_naming(lambda: on_server({"model": "mlp"}), ("FEDSYNTH_ALLOWED_IMPORTS",))


def write_plugin(work: Path) -> None:
    (work / "probe-modules" / "probe_badrow.py").write_text(
        "from fedsynth.algorithm import Algorithm\n"
        "ROW = Algorithm(strategy='os:system', client='probe_badrow:update')\n"
        "def update(job):\n    return None\n")


def permitted_plugin_refused() -> Verdict:
    os.environ["FEDSYNTH_ALLOWED_IMPORTS"] = "probe_badrow"
    return refused_naming(lambda: on_server({"algorithm": "probe_badrow:ROW"}), ("'os'",))


def cli_exit(work: Path) -> Verdict:
    from fedsynth.cli import main

    write_module(work, "probe_cli_exit", "raise SystemExit(3)")
    os.environ["FEDSYNTH_ALLOWED_IMPORTS"] = "probe_cli_exit"
    repo = Path(__file__).resolve().parents[1]
    code = main(["run", "--engine", "inprocess", "--app-dir", str(repo), "--num-supernodes", "1", "--run-config",
                 f"algorithm='probe_cli_exit:X' results-dir='{work / 'results'}'"])
    return (HANDLED, f"exit {code}") if code == 2 else (WRONG, f"exit {code}, not 2 (refused before the run)")


# ---- the values a train message carries

def message_cases(work: Path) -> list[Case]:
    data = work / "data"
    if not (data / "fashion-mnist").exists():
        from tests.conftest import write_fashion_mnist

        write_fashion_mnist(data, num_train=600, num_test=100)
    raw = {"algorithm": "fedavg", "model": "mlp", "data-dir": str(data), "cache-dir": str(work / "cache"),
           "results-dir": str(work / "results"), "partition": "iid", "local-steps": 1, "batch-size": 16}
    values = [("lr", math.nan), ("lr", -0.1), ("lr", "0.1"), ("lr", math.inf), ("server-round", -1),
              ("server-round", "one"), ("compression", "bogus"), ("compression", 5)]
    cases = [Case("message values", f"fedavg: {key} = {value!r}", lambda k=key, v=value: train_value(raw, k, v),
                  timeout=60) for key, value in values]
    sam = {**raw, "algorithm": "fedsam"}
    cases += [Case("message values", f"fedsam: sam-rho = {value!r}", lambda v=value: train_value(sam, "sam-rho", v),
                   timeout=60) for value in (math.nan, -1.0, "big")]
    return cases


def train_value(raw: dict, key: str, value: object) -> Verdict:
    """One train message to the real ClientApp, its config's `key` set to `value`: refused naming the key?"""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import app
    from common.records import model_weights, to_record
    from common.run.config import parse_run_config
    from common.run.task import make_model
    from server_app.registry import SERVER_STRATEGIES, train_config_of

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    config = {**train_config_of(cfg, 1), key: value}

    def send() -> object:
        content = RecordDict({"arrays": to_record(model_weights(make_model(cfg, seeded=True))),
                              "config": ConfigRecord(config)})
        context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 2},
                          state=RecordDict(), run_config=dict(raw))
        reply = app(Message(content, dst_node_id=1000, message_type=MessageType.TRAIN), context)
        return dict(reply.content["metrics"]) if reply.has_content() else reply.error

    return refused_naming(send, (f"'{key}'", f"{key}:"))


__all__ = ["import_cases", "message_cases"]
