# tests/library_app/library_app/server_app.py: the ServerApp runs one fedsynth strategy, named by the run config
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fedsynth import strategies
from library_app.task import initial_net

app = ServerApp()

# the server side of FedSynSAM and DynaFed builds the app's model; "mnist" gives its input shape (1x28x28, 10 classes)
DISTILLATION = strategies.DistillationSettings(
    task=strategies.ServerTask(model="library_app.task:make_net", dataset="mnist"),
    trajectory_rounds=1, synthetic_ipc=1, distill_iterations=2, distill_inner_steps=1)
STRATEGIES = {
    "fedavg": lambda: strategies.FedAvg(),
    "fedavgm": lambda: strategies.FedAvgM(server_momentum=0.5),
    "fedsam": lambda: strategies.FedSAM(sam_rho=0.05),
    "mofedsam": lambda: strategies.MoFedSAM(sam_rho=0.05),
    "fedlesam": lambda: strategies.FedLESAM(sam_rho=0.05),
    "fedlesam-d": lambda: strategies.FedLESAMD(sam_rho=0.05),
    "fedsmoo": lambda: strategies.FedSMOO(sam_rho=0.05),
    "scaffold": lambda: strategies.Scaffold(),
    "fedcog": lambda: strategies.FedCOG(cog_start_round=2),
    "fedsynsam": lambda: strategies.FedSynSAM(codec=strategies.QSGD(bits=4), distillation=DISTILLATION),
    "dynafed": lambda: strategies.DynaFed(server_training=strategies.DynaFedTraining(dynafed_epochs=1),
                                          distillation=DISTILLATION),
}


def run(grid: Grid, run_config: dict) -> tuple[strategies.FedAvg, Result]:
    """The strategy the run config names, started on `grid`; the strategy (its `round_log`) and Flower's Result."""
    strategy = STRATEGIES[str(run_config["strategy"])]()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(initial_net().state_dict()),
                            num_rounds=int(run_config["num-server-rounds"]), timeout=600,
                            train_config=ConfigRecord({"lr": float(run_config["lr"])}))
    return strategy, result


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, dict(context.run_config))
