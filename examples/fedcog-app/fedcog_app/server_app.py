"""fedcog-app's ServerApp: fedsynth's FedCOG strategy run through Flower's `Strategy.start()`.

The strategy is built from keyword parameters and returns Flower's `Result`;
`central_evaluate` scores the global model on held-out test images before
the first round and after every round. With `result-dir` set, the final
model (`final_model.pt`) and the metrics (`result.json`) are written there.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedcog_app.task import Net, central_test_set, initial_model
from fedsynth.client import evaluate_model
from fedsynth.strategies import FedCOG

app = ServerApp()


def make_central_evaluate(data_dir: str):
    """`evaluate_fn` for `start()`: (round, global model) -> its central test loss and accuracy."""
    x, y = central_test_set(data_dir)

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Net()
        net.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            loss, accuracy = evaluate_model(net, x, y)
        return MetricRecord({"central-loss": loss, "central-accuracy": accuracy})

    return central_evaluate


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedCOG for `num-server-rounds` rounds and keep the result."""
    config = context.run_config
    net = initial_model(int(config["seed"]))
    strategy = FedCOG(fraction_train=float(config["fraction-train"]), min_nodes=2, seed=int(config["seed"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        timeout=600,
        train_config=ConfigRecord({"lr": float(config["lr"])}),
        evaluate_fn=make_central_evaluate(str(config["data-dir"])),
    )
    if config["result-dir"]:
        folder = Path(str(config["result-dir"]))
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(result.arrays.to_torch_state_dict(), folder / "final_model.pt")
        metrics = {str(r): dict(m) for r, m in result.evaluate_metrics_serverapp.items()}
        train = {str(r): dict(m) for r, m in result.train_metrics_clientapp.items()}
        (folder / "result.json").write_text(json.dumps({"central": metrics, "train": train}, indent=1))
