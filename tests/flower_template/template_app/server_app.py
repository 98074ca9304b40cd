"""template-app: the ServerApp of `flwr new`'s PyTorch template; the strategy is the only change
(`STRATEGIES`, picked by the run config's `strategy`). The final model and the central accuracies go to
`result-dir` when it is set."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Strategy

from fedsynth import strategies
from template_app.task import Net, central_test_set, initial_net

app = ServerApp()

STRATEGIES: dict[str, Callable[[float], Strategy]] = {
    "flower-fedavg": lambda fraction: FlowerFedAvg(fraction_train=fraction),
    "fedavg": lambda fraction: strategies.FedAvg(fraction_train=fraction, min_available_nodes=2),
    "fedsam": lambda fraction: strategies.FedSAM(fraction_train=fraction, sam_rho=0.05),
    "scaffold": lambda fraction: strategies.Scaffold(fraction_train=fraction),
    "fedsynsam": lambda fraction: strategies.FedSynSAM(
        fraction_train=fraction, codec=strategies.QSGD(bits=4), distillation=strategies.DistillationSettings(
            trajectory_rounds=1, synthetic_ipc=1, distill_iterations=2,
            task=strategies.ServerTask(model="template_app.task:make_net", dataset="fashion-mnist"))),
    "fedcog": lambda fraction: strategies.FedCOG(fraction_train=fraction, cog_start_round=2),
    "dfedavg": lambda fraction: strategies.DFedAvg(gossip=strategies.Gossip(topology="ring")),
    "oledfl": lambda fraction: strategies.OledFL(gossip=strategies.Gossip(topology="ring"), ole_beta=0.5),
}


def central_evaluate(data_dir: str, batch_norm: bool, progress: Path | None) -> Callable[[int, ArrayRecord], MetricRecord]:
    """The central accuracy of each round's model; with `progress`, one JSON line per round appended there."""
    x, y = central_test_set(data_dir)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Net(batch_norm=batch_norm)
        net.load_state_dict(arrays.to_torch_state_dict())
        net.eval()
        with torch.no_grad():
            accuracy = float((net(x).argmax(1) == y).float().mean())
        if progress is not None:
            with progress.open("a") as out:
                out.write(json.dumps({"round": server_round, "accuracy": accuracy}) + "\n")
        return MetricRecord({"accuracy": accuracy})

    return evaluate


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    config = context.run_config
    batch_norm = bool(config.get("batch-norm", True))
    folder = Path(str(config["result-dir"])) if config["result-dir"] else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    strategy = STRATEGIES[str(config["strategy"])](float(config["fraction-train"]))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(initial_net(batch_norm).state_dict()),
                            train_config=ConfigRecord({"lr": float(config["lr"])}),
                            num_rounds=int(config["num-server-rounds"]),
                            evaluate_fn=central_evaluate(str(config["data-dir"]), batch_norm,
                                                         folder / "progress.jsonl" if folder else None))
    if folder is not None:
        torch.save(result.arrays.to_torch_state_dict(), folder / "final_model.pt")
        central = {str(r): dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
        train = {str(r): dict(m) for r, m in result.train_metrics_clientapp.items()}
        (folder / "result.json").write_text(json.dumps({"central": central, "train": train}, indent=1))
