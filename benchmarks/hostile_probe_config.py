"""The hostile probe's families of settings (benchmarks/hostile_probe.py): the public strategy constructors, the run
config and the `fedsynth` command line.

What counts as bad is read from the docs: a number that is NaN, infinite, negative, text or a bool; text or a bool that
is not what the parameter takes; a fraction or share above 1 (docs/configuration.md gives their ranges). For the
values the docs leave to the key's own range (0, a huge number, an unknown choice) the run config's verdict on the
same key is the reference: docs/library.md says a class refuses what the run config refuses, with its message.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import tempfile
from pathlib import Path

from hostile_probe import HANDLED, UNCLEAR, WRONG, Case, Verdict, refused_naming

REPO = Path(__file__).resolve().parents[1]
NUMBER_VALUES = (math.nan, math.inf, -1, 0, "0.5", True, "huge")
OWN_NUMBER_VALUES = (math.nan, -1, "0.5", "huge")
TEXT_VALUES = ("bogus", 0, None)
BOOL_VALUES = (1, "yes", None)
BOUNDED_BY_ONE = ("fraction", "share", "topk_ratio")


def public_classes() -> list[type]:
    import fedsynth.strategies as public

    return [getattr(public, n) for n in public.__all__
            if isinstance(getattr(public, n), type) and hasattr(getattr(public, n), "start")]


def algorithm_of(cls: type) -> str:
    from common.algorithm_table import ALGORITHMS

    return next(name for name, row in ALGORITHMS.items() if row.strategy_name == cls.__name__)


def run_config_refuses(name: str, value: object, algorithm: str) -> bool | None:
    """Whether the run config refuses `value` for the key named like parameter `name` (None: no such key)."""
    from common.errors import ConfigError
    from common.run.config import config_fields, parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    if name not in {f.name for f in config_fields()}:
        return None
    try:
        parse_run_config({"algorithm": algorithm, name.replace("_", "-"): value}, SERVER_STRATEGIES)
    except ConfigError:
        return True
    except Exception:  # noqa: BLE001 - any other refusal is a refusal too
        return True
    return False


def docs_call_bad(name: str, default: object, value: object) -> bool | None:
    """The docs' verdict on `value` for a parameter whose default is `default` (None: the key's own range decides)."""
    if isinstance(default, bool):
        return not isinstance(value, bool)
    if isinstance(default, (int, float)):
        if value is None or isinstance(value, (str, bool)):
            return True
        if not math.isfinite(value) or value < 0:
            return True
        if value > 1 and any(word in name for word in BOUNDED_BY_ONE):
            return True
        return None
    if isinstance(default, str):
        return None if isinstance(value, str) else True
    return None


def constructor_case(cls: type, name: str, default: object, value: object) -> Case:
    if value == "huge" and isinstance(value, str):
        value = 10**12 if isinstance(default, int) and not isinstance(default, bool) else 1e300

    def run() -> Verdict:
        bad = docs_call_bad(name, default, value)
        refuses = run_config_refuses(name, value, algorithm_of(cls))
        expected_bad = bad if bad is not None else bool(refuses)
        verdict = refused_naming(lambda: cls(**{name: value}), (name, name.replace("_", "-")),
                                 accepted_ok=not expected_bad)
        if verdict[0] == WRONG and refuses is False:
            return WRONG, verdict[1] + "; the run config accepts it too"
        if verdict[0] == HANDLED and not expected_bad and not verdict[1].startswith("accepted"):
            return HANDLED, "refused (stricter than the docs): " + verdict[1]
        return verdict

    return Case("constructors", f"{cls.__name__}({name}={value!r})", run)


def constructor_cases() -> list[Case]:
    """FedAvg: every parameter with a plain default, each bad value; each other class: the parameters FedAvg lacks."""
    cases, seen = [], set()
    for cls in sorted(public_classes(), key=lambda c: c.__name__ != "FedAvg"):  # FedAvg first: all its values
        full = cls.__name__ == "FedAvg"
        for name, parameter in inspect.signature(cls).parameters.items():
            default = parameter.default
            if not isinstance(default, (int, float, str)) or (name in seen and not full):
                continue
            if isinstance(default, bool):
                values = BOOL_VALUES
            elif isinstance(default, (int, float)):
                values = NUMBER_VALUES if full else OWN_NUMBER_VALUES
            else:
                values = TEXT_VALUES if full else TEXT_VALUES[:2]
            cases += [constructor_case(cls, name, default, v) for v in values]
            seen.add(name)
    return cases + [Case("constructors", name, run) for name, run in _other_parameter_runs()]


def _other_parameter_runs() -> list[tuple[str, object]]:
    """The parameters without a plain default: node_settings, lr_schedule, nodes, parameter_names."""
    from fedsynth.strategies import AppWiring

    def build(**kwargs: object):
        return lambda: refused_naming(lambda: AppWiring(**kwargs), tuple(kwargs))

    return [
        ("AppWiring(node_settings='lr=1')", build(node_settings="lr=1")),
        ("AppWiring(node_settings={'lr': object()})", build(node_settings={"lr": object()})),
        ("AppWiring(node_settings={'lr': nan})", build(node_settings={"lr": math.nan})),
        ("AppWiring(lr_schedule=0.1)", build(lr_schedule=0.1)),
        ("AppWiring(nodes='all')", build(nodes="all")),
        ("AppWiring(nodes=[1, 2])", build(nodes=[1, 2])),
        ("AppWiring(parameter_names='w')", build(parameter_names="w")),
        ("AppWiring(parameter_names=[1, 2])", build(parameter_names=[1, 2])),
    ]


# --run-config texts: (text, the docs' verdict: True = must be refused naming the key)
RUN_CONFIG_TEXTS = [
    ("lr=nan", "lr"), ("lr=inf", "lr"), ("lr=-0.1", "lr"), ("lr='0.1'", "lr"), ("lr=true", "lr"),
    ("num-server-rounds=0", "num-server-rounds"), ("num-server-rounds=-3", "num-server-rounds"),
    ("num-server-rounds=2.5", "num-server-rounds"), ("seed=-1", "seed"), ("seed=1.5", "seed"),
    ("batch-size=0", "batch-size"), ("local-epochs=0", "local-epochs"), ("local-steps=-1", "local-steps"),
    ("fraction-train=0", "fraction-train"), ("fraction-train=1.5", "fraction-train"), ("min-nodes=0", "min-nodes"),
    ("max-failed-rounds=-1", "max-failed-rounds"), ("round-timeout=0", "round-timeout"),
    ("round-timeout=-5", "round-timeout"), ("reply-poll-interval=0", "reply-poll-interval"),
    ("node-wait-timeout=-1", "node-wait-timeout"), ("eval-every=-1", "eval-every"),
    ("checkpoint-every=-1", "checkpoint-every"), ("alpha=0", "alpha"), ("alpha=-1", "alpha"),
    ("classes-per-client=0", "classes-per-client"), ("local-test-fraction=1.5", "local-test-fraction"),
    ("local-test-fraction=-0.1", "local-test-fraction"), ("momentum=-0.5", "momentum"),
    ("momentum=1.5", "momentum"), ("weight-decay=-1", "weight-decay"), ("clip-grad-norm=-1", "clip-grad-norm"),
    ("lr-decay=0", "lr-decay"), ("lr-decay=-1", "lr-decay"), ("server-lr=-1", "server-lr"),
    ("server-lr=0", "server-lr"), ("trim-fraction=0.5", "trim-fraction"), ("byzantine-nodes=-1", "byzantine-nodes"),
    ("max-weight-share=0", "max-weight-share"), ("max-update-norm=-1", "max-update-norm"),
    ("max-update-norm-ratio=-1", "max-update-norm-ratio"), ("bits=1", "bits"), ("bits=0", "bits"),
    ("bits=64", "bits"), ("levels=-1", "levels"), ("topk-ratio=0", "topk-ratio"), ("topk-ratio=1.5", "topk-ratio"),
    ("qsgd-bucket=0", "qsgd-bucket"), ("sam-rho=-0.05", "sam-rho"), ("gn-groups=3", "gn-groups"),
    ("dataset='bogus'", "dataset"), ("model='bogus'", "model"),
    ("device='tpu'", "device"), ("partition='bogus'", "partition"), ("aggregation='mean'", "aggregation"),
    ("compression='zip'", "compression"), ("algorithm='fedbogus'", "algorithm"), ("run-name='../outside'", "run-name"),
    ("run-name='a/b'", "run-name"), ("synthetic-ipc=0", "synthetic-ipc"), ("trajectory-rounds=-1", "trajectory-rounds"),
    ("update-norm-action='drop'", "update-norm-action"), ("max-missing-nodes=-1", "max-missing-nodes"),
    ("lr", "lr"), ("=5", "=5"), ("unknown-key=1", "unknown-key"), ("bounded-influence=1", "bounded-influence"),
    ("partition='node' dataset='own'", "image-channels"), ("num-classes=-2", "num-classes"),
    ("image-size=-8", "image-size"), ("class-names='a,a'", "class-names"),
]


def run_config_case(text: str, key: str) -> Case:
    def run() -> Verdict:
        from common.run.config import parse_overrides, parse_run_config
        from server_app.registry import SERVER_STRATEGIES

        return refused_naming(lambda: parse_run_config(parse_overrides(text), SERVER_STRATEGIES), (key,))

    return Case("run-config", f"--run-config \"{text}\"", run)


def run_config_cases() -> list[Case]:
    cases = [run_config_case(text, key) for text, key in RUN_CONFIG_TEXTS]
    # a NUL byte in a text key, and a quoted number that must stay text (Flower's rule): the documented behaviour
    cases.append(Case("run-config", "run-name with a NUL byte", lambda: _parse_raw({"run-name": "a\x00b"}, "run-name")))
    cases.append(Case("run-config", "run-name='2024' stays text", lambda: _parse_raw_accepted("run-name='2024'")))
    return cases


def _parse_raw(raw: dict, key: str) -> Verdict:
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    return refused_naming(lambda: parse_run_config(raw, SERVER_STRATEGIES), (key,))


def _parse_raw_accepted(text: str) -> Verdict:
    from common.run.config import parse_overrides, parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    cfg = parse_run_config(parse_overrides(text), SERVER_STRATEGIES)
    return (HANDLED, "kept as text") if cfg.run_name == "2024" else (WRONG, f"run-name became {cfg.run_name!r}")


def cli_verdict(argv: list[str], names: tuple[str, ...]) -> Verdict:
    """`fedsynth ARGV` in this (forked) process, its output to a file: refused non-zero naming one of `names`?"""
    from fedsynth.cli import main

    log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        code = main(argv)
    except SystemExit as stop:  # a text code is what the interpreter prints to stderr on its way out
        code = stop.code if isinstance(stop.code, int) else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - an exception out of the CLI is a raw traceback to the user
        sys.stderr.flush()
        return UNCLEAR, f"raised {type(err).__name__}: {err}"
    sys.stdout.flush()
    sys.stderr.flush()
    text = Path(log.name).read_text()
    last = " / ".join(line.strip() for line in text.strip().splitlines()[-2:])
    if code == 0:
        return WRONG, f"exit 0: {last[:300]}"
    if "Traceback (most recent call last)" in text:
        return UNCLEAR, f"exit {code} with a traceback: {last[:300]}"
    if any(name.lower() in text.lower() for name in names):
        return HANDLED, f"exit {code}: {last[:300]}"
    return UNCLEAR, f"exit {code}, names none of {names}: {last[:300]}"


def shown(argument: str, work: Path) -> str:
    """An argument as the report shows it: the probe's folders by their role, a run config's text by its last key."""
    if argument.startswith("data-dir="):
        extra = argument.split("central-eval=false")[-1].strip()
        return f'"<tiny run>{" " + extra if extra else ""}"'
    return argument.replace(str(work), "WORK").replace(str(REPO), "REPO")


def cli_cases(work: Path) -> list[Case]:
    data = work / "data"
    base = ["run", "--engine", "inprocess", "--app-dir", str(REPO)]
    tiny = (f"data-dir='{data}' model='mlp' local-steps=1 num-server-rounds=1 results-dir='{work / 'results'}' "
            "central-eval=false")
    garbage = work / "garbage.toml"
    garbage.write_text("[study\nname = ")
    unknown = work / "unknown-key.toml"
    unknown.write_text('[study]\nname = "x"\nbogus-key = 1\n')
    summary_dir = work / "summary-is-dir"
    (summary_dir / "summary.json").mkdir(parents=True)
    bad_summary = work / "bad-summary"
    bad_summary.mkdir()
    (bad_summary / "summary.json").write_text("{not json")
    runs = [
        (base + ["--num-supernodes", "0", "--run-config", tiny], ("num-supernodes",)),
        (base + ["--num-supernodes", "-1", "--run-config", tiny], ("num-supernodes",)),
        (base + ["--num-supernodes", "abc"], ("num-supernodes",)),
        (base + ["--cpus-per-client", "0", "--num-supernodes", "2", "--run-config", tiny], ("cpus-per-client",)),
        (base + ["--cpus-per-client", "nan", "--num-supernodes", "2", "--run-config", tiny], ("cpus-per-client",)),
        (base + ["--gpus-per-client", "-1", "--num-supernodes", "2", "--run-config", tiny], ("gpus-per-client",)),
        (base + ["--gpus-per-client", "nan", "--num-supernodes", "2", "--run-config", tiny], ("gpus-per-client",)),
        (base + ["--run-config", tiny + " lr=nan"], ("'lr'",)),
        (base + ["--run-config", tiny + " bogus-key=1"], ("bogus-key",)),
        (base + ["--run-config", tiny + " lr"], ("'lr'",)),
        (["run", "--engine", "bogus"], ("engine",)),
        (["run", "--engine", "inprocess", "--app-dir", str(work / "nowhere"), "--run-config", tiny], ("nowhere",)),
        (["compare", "--engine", "inprocess", "--app-dir", str(REPO), "--algorithms", "fedavg,fedbogus",
          "--num-supernodes", "2", "--run-config", tiny], ("fedbogus",)),
        (["compare", "--engine", "inprocess", "--app-dir", str(REPO), "--algorithms", ",",
          "--num-supernodes", "2", "--run-config", tiny], ("algorithms",)),
        (["study", str(work / "missing.toml"), "--app-dir", str(REPO)], ("missing.toml",)),
        (["study", str(garbage), "--app-dir", str(REPO)], ("garbage.toml",)),
        (["study", str(unknown), "--app-dir", str(REPO)], ("bogus-key",)),
        (["status", str(work / "no-such-run")], ("no-such-run",)),
        (["status", str(summary_dir)], ("summary.json",)),
        (["status", str(bad_summary)], ("summary.json",)),
        (["data", "fetch", "bogus"], ("dataset",)),
    ]
    return [Case("cli", "fedsynth " + " ".join(shown(a, work) for a in argv),
                 (lambda argv=argv, names=names: cli_verdict(argv, names)), timeout=90) for argv, names in runs]
