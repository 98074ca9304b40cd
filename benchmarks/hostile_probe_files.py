"""The hostile probe's file family (benchmarks/hostile_probe.py): checkpoints, a study's ledger, a site's data folder
and a user's model factory that are wrong, each judged by docs/reliability.md and docs/own-data.md.

- A resume of a checkpoint that is corrupt, truncated, not a file, missing, from another model, holding NaN/inf or a
  huge weight, or written under another config is refused with a message naming the checkpoint (or the differing
  keys) before anything runs (docs/reliability.md "Checkpoints and resume").
- A ledger path that is not a file is refused naming it; its broken lines are recorded, not read as nothing.
- A site folder that is missing, empty, undecodable, holds labels outside the label space or links out of the site is
  refused naming the node and the path (docs/own-data.md).
- A model factory that cannot start a run is refused naming the factory, before any round.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np

from hostile_probe import HANDLED, UNCLEAR, WRONG, Case, Verdict, refused_naming

FACTORIES = '''
import itertools, torch
from torch import nn

def _mlp(num_classes, channels, image_size, hidden=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))

def nan_init(num_classes, channels, image_size):
    model = _mlp(num_classes, channels, image_size)
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    return model

_calls = itertools.count()

def growing(num_classes, channels, image_size):
    return _mlp(num_classes, channels, image_size, hidden=8 + next(_calls))

def seven_outputs(num_classes, channels, image_size):
    return _mlp(7, channels, image_size)

def not_a_module(num_classes, channels, image_size):
    return "a model"

def raises(num_classes, channels, image_size):
    raise RuntimeError("the site's GPU driver is missing")

def no_parameters(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten())

def huge_init(num_classes, channels, image_size):
    model = _mlp(num_classes, channels, image_size)
    with torch.no_grad():
        model[1].weight.fill_(1e30)
    return model

def wrong_input(num_classes, channels, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(5, num_classes))
'''


def tiny_run_config(work: Path, run_name: str, **extra: object) -> dict:
    return {"data-dir": str(work / "data"), "cache-dir": str(work / "cache"), "results-dir": str(work / "results"),
            "run-name": run_name, "num-server-rounds": 1, "local-steps": 1, "batch-size": 16, "model": "mlp",
            "checkpoint-every": 1, **extra}


def file_cases(work: Path) -> list[Case]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import write_fashion_mnist

    write_fashion_mnist(work / "data", num_train=600, num_test=100)
    (work / "probe_factories.py").write_text(textwrap.dedent(FACTORIES))
    from fedsynth.inprocess import InProcessGrid, run_federation

    base = tiny_run_config(work, "base")
    run_federation(base, InProcessGrid(2, base))  # the checkpoint the resume cases copy
    return checkpoint_cases(work) + ledger_cases(work) + site_cases(work) + factory_cases(work)


# ---- checkpoints

def resume(work: Path, name: str, damage, names: tuple[str, ...], accepted_ok: bool = False, grid_nodes: int = 2,
           **extra: object) -> Verdict:
    """Copy the base run to `name`, `damage(checkpoint path)`, resume it to round 2; refused naming `names`?"""
    from fedsynth.inprocess import InProcessGrid, run_federation

    folder = work / "results" / name
    shutil.copytree(work / "results" / "base", folder)
    (folder / ".lock").unlink(missing_ok=True)
    damage(folder / "checkpoint.safetensors")
    raw = tiny_run_config(work, name, **{"num-server-rounds": 2, "resume": True, **extra})

    def run() -> object:
        summary = run_federation(raw, InProcessGrid(grid_nodes, raw))
        status = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
        if status.get("status") not in (None, "ok"):
            raise RuntimeError(f"summary status {status.get('status')}: {status.get('status-reason')}")
        return summary.get("status") if isinstance(summary, dict) else summary

    return refused_naming(run, names, accepted_ok=accepted_ok)


def read_checkpoint(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        return dict(handle.metadata()), {k: handle.get_tensor(k) for k in handle.keys()}


def rewritten(change_meta=None, change_tensors=None, checksum: bool = True):
    """A damage that rewrites the checkpoint's fields, with a checksum that matches them (the fields are wrong)."""
    def damage(path: Path) -> None:
        from safetensors.numpy import save_file

        from server_app.checkpoint import contents_checksum

        meta, tensors = read_checkpoint(path)
        meta = change_meta(meta) if change_meta else meta
        tensors = change_tensors(tensors) if change_tensors else tensors
        meta.pop("checksum", None)
        if checksum:
            meta["checksum"] = contents_checksum(tensors, meta)
        path.unlink()
        save_file(tensors, str(path), metadata=meta)
    return damage


def model_tensors(change):
    return lambda t: {k: (change(v) if k.startswith("model/") and k.endswith("weight") else v) for k, v in t.items()}


def checkpoint_cases(work: Path) -> list[Case]:
    def cut(path: Path) -> None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        for i in range(len(data) - 400, len(data) - 300):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))

    def directory(path: Path) -> None:
        path.unlink()
        path.mkdir()

    damages = [
        ("truncated to half", cut, ("checkpoint",)),
        ("100 bytes flipped", flip, ("checkpoint", "checksum")),
        ("empty file", lambda p: p.write_bytes(b""), ("checkpoint",)),
        ("garbage text", lambda p: p.write_text("not a checkpoint"), ("checkpoint",)),
        ("a directory", directory, ("checkpoint",)),
        ("missing", lambda p: p.unlink(), ("checkpoint",)),
        ("another model's shapes", rewritten(change_tensors=model_tensors(lambda v: v[:, :-1].copy())),
         ("checkpoint",)),
        ("a float64 model", rewritten(change_tensors=model_tensors(lambda v: v.astype(np.float64))), ("checkpoint",)),
        ("NaN weight", rewritten(change_tensors=model_tensors(lambda v: v * np.nan)), ("checkpoint",)),
        ("huge finite weight 1e30 (documented: only non-finite arrays are refused)",
         rewritten(change_tensors=model_tensors(lambda v: np.full_like(v, 1e30))), ("checkpoint",), True),
        ("checksum removed", rewritten(checksum=False), ("accept-unverified-checkpoint",)),
        ("round 0", rewritten(change_meta=lambda m: {**m, "round": "0"}), ("round",)),
        ("round 99", rewritten(change_meta=lambda m: {**m, "round": "99"}), ("round",)),
        ("round 'one'", rewritten(change_meta=lambda m: {**m, "round": "one"}), ("round", "checkpoint")),
        ("metrics not JSON", rewritten(change_meta=lambda m: {**m, "metrics": "[{"}), ("metrics", "checkpoint")),
        ("nodes not a table", rewritten(change_meta=lambda m: {**m, "nodes": '"all"'}), ("nodes",)),
        ("torch RNG state cut", rewritten(change_tensors=lambda t: {**t, "rng/torch": t["rng/torch"][:10]}),
         ("rng",)),
    ]
    cases = [Case("files", f"checkpoint: {damage[0]}",
                  lambda n=i, d=damage: resume(work, f"ckpt-{n}", *d[1:]), timeout=60)
             for i, damage in enumerate(damages)]
    cases.append(Case("files", "checkpoint: resumed under another lr",
                      lambda: resume(work, "ckpt-lr", lambda p: None, ("lr",), lr=0.2), timeout=60))
    cases.append(Case("files", "checkpoint: resumed with 3 nodes, written with 2",
                      lambda: resume(work, "ckpt-nodes", lambda p: None, ("node",), grid_nodes=3), timeout=60))
    return cases


# ---- the study's ledger

def ledger_verdict(work: Path, name: str, prepare) -> Verdict:
    from fedsynth.study.ledger import Ledger

    path = work / "ledgers" / name / "ledger.jsonl"
    path.parent.mkdir(parents=True)
    prepare(path)
    try:
        ledger = Ledger(path)
    except Exception as err:  # noqa: BLE001
        text = f"{type(err).__name__}: {err}"
        return (HANDLED, text) if str(path) in str(err) or "ledger" in str(err).lower() else (UNCLEAR, text)
    if ledger.malformed:
        return HANDLED, "recorded: " + "; ".join(ledger.malformed)[:200]
    if ledger.entries:
        return WRONG, f"read {len(ledger.entries)} entries: {list(ledger.entries)[:3]}"
    return WRONG, "read as an empty ledger without a word (the study would run every run again)"


def ledger_cases(work: Path) -> list[Case]:
    entry = json.dumps({"key": "run-a", "scores": {"acc": {"last": 0.5}}, "seed": 0})
    preparations = [
        ("a directory", lambda p: p.mkdir()),
        ("garbage text", lambda p: p.write_text("this is not json\nnor is this\n")),
        ("binary junk", lambda p: p.write_bytes(bytes(range(256)) * 4)),
        ("a garbage line between two entries",
         lambda p: p.write_text(entry + "\n{broken\n" + entry.replace("run-a", "run-b") + "\n")),
        ("entries that are lists", lambda p: p.write_text('[1, 2]\n["key", "x"]\n')),
        ("an entry whose scores are text", lambda p: p.write_text('{"key": "k", "scores": "high"}\n')),
        ("an entry whose key is a number", lambda p: p.write_text('{"key": 5, "scores": {}}\n')),
    ]
    return [Case("files", f"ledger.jsonl: {n}", lambda n=n, p=p: ledger_verdict(work, n.replace(" ", "-"), p))
            for n, p in preparations]


# ---- a site's own data folder

def site_verdict(work: Path, name: str, prepare, names: tuple[str, ...], accepted_ok: bool = False,
                 **keys: object) -> Verdict:
    from common.data.site_data import load_site_data, site_spec
    from common.run.config import parse_run_config
    from server_app.registry import SERVER_STRATEGIES

    folder = work / "sites" / name
    folder.mkdir(parents=True)
    prepare(folder)
    raw = {"partition": "node", "dataset": "own", "image-channels": 1, "image-size": 16, "class-names": "cat,dog",
           "dataset-path": str(folder), "cache-dir": str(work / "cache" / name), **keys}
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    return refused_naming(lambda: len(load_site_data(site_spec(cfg, str(folder)), name,
                                                     str(work / "cache" / name)).y_train),
                          names, accepted_ok=accepted_ok)


def png(path: Path, size: int = 16, mode: str = "L") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size), dtype=np.uint8)).convert(mode).save(path)


def site_cases(work: Path) -> list[Case]:
    def classes(folder: Path, names=("cat", "dog"), count: int = 3) -> None:
        for label in names:
            for i in range(count):
                png(folder / "train" / label / f"{i}.png")

    def link_out(folder: Path) -> None:
        classes(folder)
        (folder / "train" / "cat" / "out.png").symlink_to("/etc/hostname")

    def loop(folder: Path) -> None:
        classes(folder)
        (folder / "train" / "cat" / "again").symlink_to(folder / "train")

    def broken(folder: Path) -> None:
        classes(folder)
        (folder / "train" / "dog" / "gone.png").symlink_to(folder / "nowhere.png")

    def undecodable(folder: Path) -> None:
        classes(folder)
        (folder / "train" / "dog" / "bad.png").write_bytes(b"\x89PNG not really")

    def csv(rows: str):
        def prepare(folder: Path) -> None:
            for i in range(3):
                png(folder / f"{i}.png")
            (folder / "labels.csv").write_text("image,label\n" + rows)
        return prepare

    preparations = [
        ("missing", lambda f: f.rmdir(), ("missing", "does not exist", "not found")),
        ("empty", lambda f: None, ("empty",)),
        ("a foreign class folder", lambda f: classes(f, ("cat", "zebra")), ("zebra",)),
        ("class folders that are ids without class-names", lambda f: classes(f, ("0", "1")), ("class",)),
        ("a link out of the site", link_out, ("out.png", "link")),
        ("a link loop", loop, ("again", "loop", "link")),
        ("a broken link", broken, ("gone.png",)),
        ("an undecodable image", undecodable, ("bad.png",)),
        ("a csv label NaN", csv("0.png,cat\n1.png,\n2.png,dog\n"), ("label", "row")),
        ("a csv label outside the classes", csv("0.png,cat\n1.png,horse\n2.png,dog\n"), ("horse",)),
        ("a csv path to a missing image", csv("0.png,cat\n9.png,dog\n"), ("9.png",)),
        ("only a test split", lambda f: [png(f / "test" / "cat" / "0.png")], ("train", "empty")),
    ]
    # one good folder read here, before the cases fork: the readers' imports (Pillow, torchvision, datasets) load once
    site_verdict(work, "warm-up", lambda f: classes(f), (), True)
    cases = [Case("files", f"site folder: {name}", lambda n=i, p=p, names=names: site_verdict(work, f"s{n}", p, names))
             for i, (name, p, names) in enumerate(preparations)]
    cases.append(Case("files", "site folder: images of another size (resized, documented)",
                      lambda: site_verdict(work, "sized", lambda f: [png(f / "train" / c / "0.png", 40)
                                                                        for c in ("cat", "dog")], (), True)))
    cases.append(Case("files", "site folder: colour images for a grey model (converted, documented)",
                      lambda: site_verdict(work, "colour", lambda f: [png(f / "train" / c / "0.png", 16, "RGB")
                                                                         for c in ("cat", "dog")], (), True)))
    return cases


# ---- a user's model factory

def factory_verdict(work: Path, factory: str, names: tuple[str, ...], accepted_ok: bool = False) -> Verdict:
    from fedsynth.inprocess import InProcessGrid, run_federation

    sys.path.insert(0, str(work))
    spec = factory if ":" in factory else f"probe_factories:{factory}"
    raw = tiny_run_config(work, f"factory-{factory.replace(':', '-')}", model=spec)

    def run() -> object:
        summary = run_federation(raw, InProcessGrid(2, raw))
        status = json.loads((Path(raw["results-dir"]) / raw["run-name"] / "summary.json").read_text())
        if status.get("status") != "ok":
            raise RuntimeError(f"summary status {status.get('status')}: {status.get('status-reason')}")
        return summary.get("status") if isinstance(summary, dict) else summary

    return refused_naming(run, names, accepted_ok=accepted_ok)


def factory_cases(work: Path) -> list[Case]:
    factories = [("nan_init", ("nan_init",)), ("growing", ("growing",)), ("seven_outputs", ("seven_outputs",)),
                 ("not_a_module", ("not_a_module",)), ("raises", ("raises",)), ("no_parameters", ("no_parameters",)),
                 ("wrong_input", ("wrong_input",)), ("not_there", ("not_there",)), ("os:getcwd", ("os:getcwd",))]
    cases = [Case("files", f"model factory: {name}", lambda f=name, n=names: factory_verdict(work, f, n), timeout=60)
             for name, names in factories]
    cases.append(Case("files", "model factory: huge_init (1e30 weights; documented: only NaN is refused)",
                      lambda: factory_verdict(work, "huge_init", ("huge_init",), True), timeout=60))
    cases.append(Case("files", "model factory: a module that does not exist",
                      lambda: refused_naming(lambda: factory_module_missing(work), ("no_such_module",)), timeout=60))
    return cases


def factory_module_missing(work: Path) -> object:
    from fedsynth.inprocess import InProcessGrid, run_federation

    raw = tiny_run_config(work, "factory-missing", model="no_such_module:make")
    return run_federation(raw, InProcessGrid(2, raw))


__all__ = ["file_cases", "HANDLED", "UNCLEAR", "WRONG"]
