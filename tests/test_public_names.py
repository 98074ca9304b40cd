"""The public modules name what exists (issue 52): their exceptions importable from `fedsynth.strategies`, every
dotted name and file path in their docstrings resolvable, and every record or key a strategy's help() quotes
spelled as it travels."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_FILES = [*sorted((ROOT / "fedsynth" / "strategies").glob("*.py")), ROOT / "fedsynth" / "client.py",
                ROOT / "fedsynth" / "algorithm.py",
                ROOT / "common" / "algorithms" / "codec_settings.py",
                ROOT / "common" / "algorithms" / "decentralized_settings.py"]
PATH = re.compile(r"(?<![\w.])((?:[\w-]+/)+(?:[\w-]+\.(?:py|md|toml|sh|json|yml|yaml))?)")
BARE_FILE = re.compile(r"(?<![\w./-])([\w-]+\.py)\b")
DOTTED = re.compile(r"\b((?:fedsynth|server_app|client_app|common)(?:\.\w+)+)")


def docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))]
    return [doc for n in nodes if (doc := ast.get_docstring(n))]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def named_paths(doc: str) -> list[Path]:
    """Each `dir/file.py` (or `dir/`) path; a bare `file.py` after one is in the same folder."""
    out, folder = [], None
    for match in re.finditer(f"{PATH.pattern}|{BARE_FILE.pattern}", doc):
        path, bare = match.group(1), match.group(2)
        if path:
            out.append(ROOT / path)
            folder = (ROOT / path) if path.endswith("/") else (ROOT / path).parent
        elif folder is not None:
            out.append(folder / bare)
    return out


@pytest.mark.parametrize("path", PUBLIC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_in_a_public_modules_docstrings_exists(path):
    missing = []
    for doc in docstrings(path):
        missing += [str(p.relative_to(ROOT)) for p in named_paths(doc) if not p.exists()]
        missing += [name for name in DOTTED.findall(doc) if not resolves(name)]
    assert missing == []


def test_the_resolver_catches_a_name_that_does_not_exist():
    doc = "read by the codec (common/algorithms/compression.py, uplink.py) and `fedsynth.client.no_such_rule`"
    assert [p.relative_to(ROOT).as_posix() for p in named_paths(doc) if not p.exists()] == [
        "common/algorithms/compression.py", "common/algorithms/uplink.py"]
    assert not resolves("fedsynth.client.no_such_rule") and resolves("fedsynth.client.train_scaffold")


def test_the_exceptions_a_run_ends_with_are_importable_from_fedsynth_strategies():
    from fedsynth.strategies import NoFeatureSums, ReplyContractError, TooManyFailedRounds, WarmupFailed
    from server_app.fid_reference import NoFeatureSums as raised_by_fid
    from server_app.strategies.base import ReplyContractError as raised_by_rounds
    from server_app.strategies.fedddpm import WarmupFailed as raised_by_warmup

    assert (NoFeatureSums, ReplyContractError, WarmupFailed) == (raised_by_fid, raised_by_rounds, raised_by_warmup)
    assert issubclass(ReplyContractError, TooManyFailedRounds)


def test_help_quotes_each_record_and_key_as_it_travels():
    import dataclasses

    import common.protocol as protocol
    import fedsynth.strategies as public
    from common.run.config import config_fields

    wire_names = {v for k, v in vars(protocol).items() if k.isupper() and isinstance(v, str)}
    keys = {f.name.replace("_", "-") for f in config_fields()} | {"lr", "server-round", "num-examples"}
    assert "scaffold-delta-c" in public.Scaffold.__doc__
    for name in public.__all__:
        cls = getattr(public, name)
        if not (isinstance(cls, type) and hasattr(cls, "start")):
            continue
        own = cls.__doc__.split("Parameters\n")[0]
        quoted = set(re.findall(r'"([a-z][\w-]*)"', own))
        assert quoted <= wire_names | keys, (name, quoted - wire_names - keys)
    assert dataclasses.is_dataclass(public.NodeInfo)
