"""docs/library.md is executed (issue 53): its code blocks run, whole, and the app they make runs.

- Every ```python block either names a file of tests/library_app/ on its first line (`# tests/library_app/...py:
  ...`), and is that file character for character, or runs alone (`exec` in a fresh namespace).
- The app (the layout `flwr new` makes) runs every centralized strategy family with its ClientApp in process, and
  FedDDPM+ with its diffusion ClientApp: warm-up, feature sums, three rounds, one correction.
- Every call the page writes inline in backticks, `fedsynth.client`'s or `fedsynth.strategies`' (`epochs(loader,
  count)`, `decode_update(payload, shapes, spec)`, ...), names a real function, and each bare name or keyword in
  it is one of that function's parameters (a value such as `msg.content["config"]` or `0.05` is not checked).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import fedsynth.client as client
from fedsynth import strategies
from tests.library_grid import ClientAppGrid

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "library.md"
APP = REPO / "tests" / "library_app"
FILE_HEADER = re.compile(r"# (tests/library_app/\S+\.py):")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_each_block_is_a_file_of_the_app_or_runs_alone(monkeypatch):
    monkeypatch.syspath_prepend(str(APP))
    blocks = python_blocks()
    files = [FILE_HEADER.match(block) for block in blocks]
    named = {match.group(1) for match in files if match}
    assert named == {"tests/library_app/library_app/server_app.py", "tests/library_app/library_app/client_app.py",
                     "tests/library_app/library_app/ddpm_client_app.py"}
    for block, match in zip(blocks, files):
        if match:
            assert block == (REPO / match.group(1)).read_text(), f"{match.group(1)} differs from its block"
            compile(block, match.group(1), "exec")
        else:
            # as a user runs it: without this file's `from __future__ import annotations` (a dataclass in a block
            # would look its string annotations up in a module "library_block" that is not in sys.modules)
            exec(compile(block, "docs/library.md", "exec", dont_inherit=True), {"__name__": "library_block"})


def app_grid(strategy: str, nodes: int = 2) -> ClientAppGrid:
    from library_app.client_app import app

    grid = ClientAppGrid(nodes, app, app)
    for context in grid.contexts.values():
        context.run_config.update({"strategy": strategy})
    return grid


@pytest.mark.parametrize("strategy", ["fedavg", "fedavgm", "fedsam", "mofedsam", "fedlesam", "fedlesam-d", "fedsmoo",
                                      "scaffold", "fedcog", "fedsynsam", "dynafed"])
def test_the_app_runs_each_strategy_with_no_reply_dropped(monkeypatch, strategy):
    monkeypatch.syspath_prepend(str(APP))
    from library_app.server_app import STRATEGIES, run

    assert set(STRATEGIES) >= {strategy}
    built, result = run(app_grid(strategy), {"strategy": strategy, "num-server-rounds": 2, "lr": 0.05})
    assert built.round_log.latest.answered == 2 and built.round_log.latest.failures == ()
    final = {k: v.numpy() for k, v in result.arrays.items()}
    assert int(final["1.num_batches_tracked"]) > 0  # BatchNorm's counter came back from the nodes
    evaluation = result.evaluate_metrics_clientapp[2]
    assert evaluation["eval_acc"] == evaluation["local-test-accuracy"]  # Flower's names beside fedsynth's


def test_fedsynsam_s_nodes_receive_dsyn_and_send_compressed_updates(monkeypatch):
    monkeypatch.syspath_prepend(str(APP))
    from library_app.server_app import run

    grid = app_grid("fedsynsam")
    built, _ = run(grid, {"strategy": "fedsynsam", "num-server-rounds": 2, "lr": 0.05})
    round_2 = [m for m in grid.sent if m.metadata.message_type == "train" and m.content["config"]["server-round"] == 2]
    assert [("synthetic-data" in m.content.array_records) for m in round_2] == [True, True]
    assert built.round_log.latest.failures == () and built.synthetic_holders == {0, 1}


def test_fedddpm_plus_walks_through_the_phases_with_the_apps_diffusion_clientapp(monkeypatch):
    monkeypatch.syspath_prepend(str(APP))
    from library_app.ddpm_client_app import UNET, app

    grid = ClientAppGrid(2, app, app, app)
    task = strategies.ServerTask(model="unet-small", partition="node", image_channels=UNET["channels"],
                                 image_size=UNET["image_size"], diffusion_timesteps=UNET["timesteps"])
    strategy = strategies.FedDDPMPlus(
        diffusion=strategies.DiffusionTraining(task=task, aux_sampler="ddim", ddim_steps=2, aux_fraction=0.1,
                                               warmup_epochs=1, batch_size=16),
        quicktest=strategies.QuickTestSettings(sampler="ddim", quicktest_size=4, quicktest_every=100,
                                               quicktest_reference="clients", fid_features="random", oneshot_epochs=1),
        fraction_evaluate=0.0)
    initial = ArrayRecord(client.build_unet("unet-small", seed=0, **UNET).state_dict())
    result = strategy.start(grid, initial, num_rounds=3, timeout=60, train_config=ConfigRecord({"lr": 1e-3}))
    kinds = [m.metadata.message_type for m in grid.sent]
    assert kinds.count("query.fid_stats") == 2  # the feature sums, asked once per node
    warmups = [m for m in grid.sent if m.metadata.message_type == "train" and m.content["config"].get("phase")]
    assert len(warmups) == 2 and strategy.round_log.phases[0].answered == 2
    assert (strategy.stopped_at, strategy.stop_reason) == (3, "last-round")  # corrected once, at start()'s last round
    assert set(result.train_metrics_clientapp) == {1, 2, 3} and strategy.round_log.latest.failures == ()


INLINE_CALL = re.compile(r"`(?:fedsynth\.(?:client|strategies)\.)?([A-Za-z_]\w*)\(([^()`]*)\)")


def inline_calls() -> list[tuple[str, str]]:
    """`name(args)` in the page's prose (outside the code blocks), for names of fedsynth.client / .strategies."""
    prose = re.sub(r"```python\n.*?```", "", PAGE.read_text(), flags=re.S)
    public = set(client.__all__) | set(strategies.__all__)
    return [(name, args) for name, args in INLINE_CALL.findall(prose.replace("\n  ", " ").replace("\n", " "))
            if name in public]


def test_every_call_the_page_writes_names_real_parameters():
    calls = inline_calls()
    assert ("epochs", "loader, count") in calls and ("decode_update", "payload, shapes, codec") in calls
    problems = []
    for name, args in calls:
        target = getattr(client, name, None) or getattr(strategies, name)
        parameters = set(inspect.signature(target).parameters)
        for arg in (a.strip() for a in args.split(",") if a.strip()):
            word = re.fullmatch(r"([A-Za-z_]\w*)\s*(=.*)?", arg)  # a bare name or a keyword stands for a parameter
            if word and word.group(1) not in parameters:
                problems.append(f"{name}({args}): no parameter {word.group(1)!r}")
    assert problems == []


@pytest.mark.parametrize("public", [strategies.FedDDPM, strategies.FedDDPMPlus])
def test_the_diffusion_strategies_refuse_a_factory_model_in_one_sentence(public):
    """Issue 53: `model="pkg.mod:factory"` raised a bare KeyError; the page says the U-Net presets only."""
    with pytest.raises(ValueError, match=r"^Fed\w+'s model must be one of the U-Net presets unet-small, .* not "
                                         r"'library_app.task:make_net': a 'package.module:factory' model is not "
                                         r"supported for the diffusion strategies$"):
        public(diffusion=strategies.DiffusionTraining(task=strategies.ServerTask(model="library_app.task:make_net")))
