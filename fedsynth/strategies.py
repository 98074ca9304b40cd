"""fedsynth's server strategies as Flower strategies, for a Flower developer's own ServerApp.

Each class is a Flower `Strategy` built from keyword parameters with defaults,
run with Flower's own `start()`, which returns Flower's `Result`:

    from fedsynth.strategies import FedSynSAM
    strategy = FedSynSAM(fraction_train=1.0, trajectory_rounds=30, synthetic_ipc=20, compression="qsgd", bits=4)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=100,
                            train_config=ConfigRecord({"lr": 0.05}), evaluate_fn=central_evaluate)

fedsynth's own ServerApp runs the same classes' parents through the same
`start()` (server_app/app.py). The parameters every class takes:

fraction_train : float (default: 1.0)
    Fraction of the nodes sampled for training each round (at least one).
fraction_evaluate : float (default: 1.0)
    Fraction of the nodes sent an evaluate message after each round. A round whose train replies
    all carried `local-test-accuracy` (the received model's evaluation, as fedsynth's clients do)
    sends none, and the carried numbers become the round's evaluate metrics.
min_nodes : int (default: 1)
    Fewest good train replies a round needs; with fewer the model stays unchanged.
max_failed_rounds : int (default: 3)
    Rounds in a row below `min_nodes` after which `start()` raises `TooManyFailedRounds`.
seed : int (default: 0)
    Seed of the node sampling (the same seed and round draw the same nodes).
server_lr : float (default: 1.0)
    The server step: w <- w + server_lr * mean(w_i - w).
aggregation : str (default: "weighted")
    "weighted" (by `num-examples`), "uniform", or the robust "median", "trimmed-mean", "krum".
max_weight_share : float (default: 0.5, the run config's `max-weight-share`)
    No node's share of a weighted mean above this (bounded influence; 1.0 leaves the counts).
max_update_norm : float (default: 0.0)
    Bound on a node's update norm (0: none); `update_norm_action` "clip" scales longer ones, "refuse" drops them.
lr_schedule : Callable[[int], float] | None (default: None)
    If given, each round's train config carries "lr" = lr_schedule(server_round).
nodes : list[NodeInfo] | None (default: None)
    A node table (node ids with partition ids and example counts, as fedsynth's handshake learns it);
    None numbers the grid's nodes in node-id order, and every round adds the nodes that joined since.
weighted_by_key : str (default: "num-examples")
    The reply metric that weighs each reply in the averages, as in Flower's strategies.
min_available_nodes : int (default: 1)
    Each round waits until the grid has at least this many nodes, as Flower's strategies do.
**settings
    Any other run-config key by its Python name (docs/configuration.md), e.g. `model`, `dataset`,
    `compression`, `bits`, `qsgd_bucket`, `trim_fraction`.

What a node must reply to a train message (content "arrays" = the global model, "config" with "server-round",
"lr" and every setting the node's rule needs under its run-config name, e.g. "sam-rho", "compression", "bits",
"ole-beta": read them with `fedsynth.client.config_value` and `fedsynth.client.compression_from_config`):
{"arrays": the local model, "metrics": {"num-examples": int > 0, "train-loss" or Flower's "train_loss": float}};
optionally "partition-id", and "num-test-examples", "local-test-accuracy", "local-test-loss" for the received
model. An evaluate reply carries "num-examples" and "local-test-accuracy"/"local-test-loss" or Flower's
"eval_acc"/"eval_loss". Replies that errored, came late, or fail a check (a missing or mis-shaped array, a
non-finite value, a bad metric) are dropped in `aggregate_train` and listed in
`strategy.round_report["failures"]`; a first round in which every reply broke the contract raises
`ReplyContractError` saying what to change. docs/library.md lists, per strategy, the client function in
`fedsynth.client`, what the message carries and what the reply must carry.
"""

from __future__ import annotations

from typing import Any, Callable

from common.run.config import RunConfig, key_name, parse_run_config
from server_app.decentralized import DecentralizedRelay
from server_app.strategies.base import NodeInfo, ReplyContractError, RoundStrategy, TooManyFailedRounds
from server_app.strategies.dynafed import DynaFedStrategy
from server_app.strategies.fedavg import FedAvgStrategy
from server_app.strategies.fedavgm import FedAvgMStrategy
from server_app.strategies.fedddpm import FedDDPMPlusStrategy, FedDDPMStrategy
from server_app.strategies.fedsynsam import FedSynSAMStrategy
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.sam_baselines import FedLESAMDStrategy, FedLESAMStrategy, FedSMOOStrategy
from server_app.strategies.scaffold import ScaffoldStrategy
from server_app.wire import WEIGHTED_BY_KEY

__all__ = [
    "DFedAvg", "DynaFed", "FedAvg", "FedAvgM", "FedCOG", "FedDDPM", "FedDDPMPlus", "FedLESAM", "FedLESAMD", "FedSAM",
    "FedSMOO", "FedSynSAM", "MoFedSAM", "NodeInfo", "OledFL", "ReplyContractError", "Scaffold", "TooManyFailedRounds", "run_config",
]

_DEFAULTS = RunConfig()


def run_config(algorithm: str, settings: dict[str, Any]) -> RunConfig:
    """The validated run config of `algorithm` with `settings` (Python names of run-config keys) over the defaults.

    Raises TypeError for a name that is no run-config key, and common.run.config.ConfigError for a bad value.
    """
    known = {f for f in vars(_DEFAULTS)}
    unknown = sorted(name for name in settings if name not in known)
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown}: not run-config keys (docs/configuration.md)")
    raw = {"algorithm": algorithm, **{key_name(name): value for name, value in settings.items()}}
    return parse_run_config(raw, [algorithm])


def _init(strategy: RoundStrategy, parent: type, algorithm: str, nodes: list[NodeInfo] | None,
          fraction_evaluate: float, lr_schedule: Callable[[int], float] | None, weighted_by_key: str,
          min_available_nodes: int, settings: dict[str, Any]) -> None:
    """Build `parent`'s run config from keyword parameters; the round's lr comes from the train config or lr_schedule."""
    parent.__init__(strategy, run_config(algorithm, settings), nodes, fraction_evaluate=fraction_evaluate,
                    weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
    strategy.lr_schedule = lr_schedule


class FedAvg(FedAvgStrategy):
    """FedAvg (McMahan et al., 2017) with fedsynth's reply checks, seeded sampling and bounded influence.

    Parameters: the common ones (module docstring).
    """

    def __init__(self, *, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedAvgStrategy, "fedavg", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class FedSAM(FedAvgStrategy):
    """FedSAM (Qu et al., 2022): FedAvg on the server; nodes train with SAM (`fedsynth.client.train_fedsam`).

    Parameters
    ----------
    sam_rho : float (default: the run config's `sam-rho`)
        SAM's radius rho, sent in every train message's config as "sam-rho".
    And the common ones (module docstring).
    """

    def __init__(self, *, sam_rho: float = _DEFAULTS.sam_rho, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedAvgStrategy, "fedsam", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"sam_rho": sam_rho, "fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class FedCOG(FedAvgStrategy):
    """FedCOG (Ye et al., 2023): FedAvg on the server; nodes generate complementary data from the global
    model and train with knowledge distillation (`fedsynth.client`'s FedCOG functions) from `cog_start_round` on.

    The server is FedAvg's (FedCOG is client-side only); each train message carries "server-round" and
    "cog-start-round", which the node compares.

    Parameters
    ----------
    cog_start_round : int (default: the run config's `cog-start-round`; 0: the paper's schedule)
        The first round in which the nodes generate and distil, sent as "cog-start-round".
    And the common ones (module docstring).
    """

    def __init__(self, *, cog_start_round: int = _DEFAULTS.cog_start_round, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedAvgStrategy, "fedcog", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"cog_start_round": cog_start_round, "fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class FedAvgM(FedAvgMStrategy):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum.

    Parameters
    ----------
    server_momentum : float (default: the run config's)
        Momentum of the server's update. And the common ones (module docstring).
    """

    def __init__(self, *, server_momentum: float = _DEFAULTS.server_momentum,
                 fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedAvgMStrategy, "fedavgm", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"server_momentum": server_momentum, "fraction_train": fraction_train, "min_nodes": min_nodes,
               "seed": seed, **settings})


class Scaffold(ScaffoldStrategy):
    """SCAFFOLD (Karimireddy et al., 2020): sends the server control variate c, averages the nodes' c_i updates.

    Nodes reply with "scaffold-delta-c" (c_i+ - c_i) beside the model (`fedsynth.client.train_scaffold`).
    Parameters: the common ones (module docstring).
    """

    def __init__(self, *, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, ScaffoldStrategy, "scaffold", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class MoFedSAM(PreviousUpdateStrategy):
    """MoFedSAM (Qu et al., 2022): FedAvg that also sends the previous global update for the nodes' momentum.

    Parameters: the common ones (module docstring).
    """

    def __init__(self, *, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, PreviousUpdateStrategy, "mofedsam", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class FedLESAM(FedLESAMStrategy):
    """FedLESAM (Fan et al., 2024): sends the previous global update, the nodes' perturbation direction.

    Parameters: the common ones (module docstring).
    """

    def __init__(self, *, fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedLESAMStrategy, "fedlesam", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class FedLESAMD(FedLESAMDStrategy):
    """FedLESAM-D: FedDyn's server that also sends the previous global update.

    Parameters
    ----------
    dyn_alpha : float (default: the run config's)
        FedDyn's alpha. And the common ones (module docstring).
    """

    def __init__(self, *, dyn_alpha: float = _DEFAULTS.dyn_alpha, fraction_train: float = _DEFAULTS.fraction_train,
                 fraction_evaluate: float = 1.0, min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedLESAMDStrategy, "fedlesam-d", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"dyn_alpha": dyn_alpha, "fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed,
               **settings})


class FedSMOO(FedSMOOStrategy):
    """FedSMOO (Sun et al., 2023): FedDyn's server plus the global perturbation from the nodes' corrections.

    Parameters
    ----------
    dyn_alpha : float (default: the run config's)
        FedDyn's alpha.
    sam_rho : float (default: the run config's)
        Radius of the global perturbation. And the common ones (module docstring).
    """

    def __init__(self, *, dyn_alpha: float = _DEFAULTS.dyn_alpha, sam_rho: float = _DEFAULTS.sam_rho,
                 fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedSMOOStrategy, "fedsmoo", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"dyn_alpha": dyn_alpha, "sam_rho": sam_rho, "fraction_train": fraction_train, "min_nodes": min_nodes,
               "seed": seed, **settings})


class FedSynSAM(FedSynSAMStrategy):
    """FedSynSAM: FedAvg of (compressed) updates; after `trajectory_rounds` aggregations the server distils a
    synthetic set from the global-model trajectory and sends it once to every node, which then perturbs along
    the local/synthetic gradient mix (`fedsynth.client.train_fedsynsam`).

    The distillation needs the model's architecture and the data's shape on the server: `model` (a preset
    name or "package.module:factory") and `dataset`, or `image_channels`, `image_size`, `num_classes`.

    Parameters
    ----------
    trajectory_rounds : int (default: the run config's)
        R, the aggregations recorded before the distillation.
    synthetic_ipc : int (default: the run config's)
        Synthetic images per class.
    distill_iterations : int (default: the run config's)
        Iterations of the trajectory-matching distillation.
    compression : str (default: "none")
        The uplink codec the nodes use ("qsgd", "topk" or "none"), sent as "compression"; the server decodes with it.
    bits : int (default: the run config's `bits`)
        qsgd: bits per coordinate on the wire, sent as "bits".
    levels : int (default: 0, from `bits`)
        qsgd: the number of levels s, overriding `bits`, sent as "levels".
    qsgd_scope : str (default: "tensor")
        qsgd: one norm per "tensor", per "model" or per "bucket" of `qsgd_bucket` coordinates ("qsgd-scope").
    qsgd_bucket : int (default: the run config's `qsgd-bucket`)
        qsgd-scope "bucket": coordinates per bucket ("qsgd-bucket").
    sam_rho : float (default: the run config's `sam-rho`)
        The nodes' SAM radius, sent as "sam-rho".
    synsam_beta : float (default: the run config's `synsam-beta`)
        Weight of the local gradient in the nodes' ascent direction, sent as "synsam-beta".
    And the common ones (module docstring).
    """

    def __init__(self, *, trajectory_rounds: int = _DEFAULTS.trajectory_rounds,
                 synthetic_ipc: int = _DEFAULTS.synthetic_ipc, distill_iterations: int = _DEFAULTS.distill_iterations,
                 compression: str = _DEFAULTS.compression, bits: int = _DEFAULTS.bits, levels: int = _DEFAULTS.levels,
                 qsgd_scope: str = _DEFAULTS.qsgd_scope, qsgd_bucket: int = _DEFAULTS.qsgd_bucket,
                 sam_rho: float = _DEFAULTS.sam_rho, synsam_beta: float = _DEFAULTS.synsam_beta, fraction_train: float = _DEFAULTS.fraction_train,
                 fraction_evaluate: float = 1.0, min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedSynSAMStrategy, "fedsynsam", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"trajectory_rounds": trajectory_rounds, "synthetic_ipc": synthetic_ipc,
               "distill_iterations": distill_iterations, "compression": compression, "bits": bits, "levels": levels,
               "qsgd_scope": qsgd_scope, "qsgd_bucket": qsgd_bucket, "sam_rho": sam_rho, "synsam_beta": synsam_beta,
               "fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed, **settings})


class DynaFed(DynaFedStrategy):
    """DynaFed (Pi et al., 2023): FedAvg plus server training on the trajectory-distilled synthetic set.

    Parameters: as FedSynSAM's (`trajectory_rounds`, `synthetic_ipc`, `distill_iterations`), `dynafed_lr` and
    `dynafed_epochs` through settings, and the common ones (module docstring).
    """

    def __init__(self, *, trajectory_rounds: int = _DEFAULTS.trajectory_rounds,
                 synthetic_ipc: int = _DEFAULTS.synthetic_ipc, distill_iterations: int = _DEFAULTS.distill_iterations,
                 fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, DynaFedStrategy, "dynafed", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"trajectory_rounds": trajectory_rounds, "synthetic_ipc": synthetic_ipc,
               "distill_iterations": distill_iterations, "fraction_train": fraction_train, "min_nodes": min_nodes,
               "seed": seed, **settings})


class FedDDPM(FedDDPMStrategy):
    """FedDDPM: FedAvg of DDPMs, corrected on the server with an auxiliary set sampled from the nodes' warm DDPMs.

    Under `start()` its first `configure_train` runs the warm-up (every node trains its own DDPM and uploads
    it once; the server samples the auxiliary set); every aggregation is then followed by `correction_epochs`
    on that set. The record of the warm-up is in `phase_records`. The DDPM's architecture on the server comes
    from `model` and the image shape from `dataset` (or `image_channels`, `image_size`).

    Parameters
    ----------
    warmup_epochs : int (default: the run config's)
        Epochs of each node's warm-up.
    aux_fraction : float (default: the run config's)
        Auxiliary images per node, as a fraction of its example count.
    correction_epochs : int (default: the run config's)
        Server epochs on the auxiliary set after each aggregation.
    correction_lr : float (default: the run config's)
        Their learning rate.
    And the common ones (module docstring).
    """

    def __init__(self, *, warmup_epochs: int = _DEFAULTS.warmup_epochs, aux_fraction: float = _DEFAULTS.aux_fraction,
                 correction_epochs: int = _DEFAULTS.correction_epochs, correction_lr: float = _DEFAULTS.correction_lr,
                 fraction_train: float = _DEFAULTS.fraction_train, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedDDPMStrategy, "fedddpm", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"warmup_epochs": warmup_epochs, "aux_fraction": aux_fraction, "correction_epochs": correction_epochs,
               "correction_lr": correction_lr, "fraction_train": fraction_train, "min_nodes": min_nodes,
               "seed": seed, **settings})


class FedDDPMPlus(FedDDPMPlusStrategy):
    """FedDDPM+: FedDDPM's warm-up, FedAvg rounds with QuickTest every `quicktest_every` rounds, then a one-shot
    correction on the auxiliary set and a stop: later rounds of `start()` send nothing.

    Parameters
    ----------
    quicktest_every : int (default: the run config's)
        Rounds between QuickTests.
    oneshot_epochs : int (default: the run config's)
        Epochs of the one-shot correction.
    warmup_epochs : int (default: the run config's)
        Epochs of each node's warm-up (as FedDDPM's).
    aux_fraction : float (default: the run config's)
        Auxiliary images per node, as a fraction of its example count (as FedDDPM's).
    And the common ones (module docstring). The one-shot correction comes at `start()`'s `num_rounds` (or
    earlier when QuickTest fires), at `oneshot_lr` or else `train_config`'s "lr".
    """

    def __init__(self, *, quicktest_every: int = _DEFAULTS.quicktest_every,
                 oneshot_epochs: int = _DEFAULTS.oneshot_epochs, warmup_epochs: int = _DEFAULTS.warmup_epochs,
                 aux_fraction: float = _DEFAULTS.aux_fraction, fraction_train: float = _DEFAULTS.fraction_train,
                 fraction_evaluate: float = 1.0, min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, FedDDPMPlusStrategy, "fedddpm+", nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"quicktest_every": quicktest_every, "oneshot_epochs": oneshot_epochs, "warmup_epochs": warmup_epochs,
               "aux_fraction": aux_fraction, "fraction_train": fraction_train, "min_nodes": min_nodes, "seed": seed,
               **settings})


class DFedAvg(DecentralizedRelay):
    """Decentralized FedAvg over a peer topology: `configure_train` sends each node its own message (its mixing
    weights and its neighbours' last models, or their weighted sum with `relay_mixing`); `aggregate_train`
    keeps each reply as that node's model and returns their average x-bar. All nodes train every round.

    Parameters
    ----------
    topology : str (default: the run config's)
        "ring", "random" (k-regular, redrawn each round from (seed, round)), "random-pull", ...
    peers : int (default: the run config's)
        k of the random topologies.
    mixing : str (default: the run config's)
        Weights of W ("metropolis", "uniform").
    relay_mixing : bool (default: the run config's)
        Send each node the weighted sum of its neighbours' models instead of each model.
    And the common ones (module docstring); `fraction_train` does not apply.
    """

    algorithm = "dfedavg"

    def __init__(self, *, topology: str = _DEFAULTS.topology, peers: int = _DEFAULTS.peers,
                 mixing: str = _DEFAULTS.mixing, relay_mixing: bool = _DEFAULTS.relay_mixing,
                 fraction_evaluate: float = 1.0, min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1,
                 **settings: Any) -> None:
        _init(self, DecentralizedRelay, self.algorithm, nodes, fraction_evaluate, lr_schedule, weighted_by_key, min_available_nodes,
              {"topology": topology, "peers": peers, "mixing": mixing, "relay_mixing": relay_mixing,
               "min_nodes": min_nodes, "seed": seed, **settings})


class OledFL(DFedAvg):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with `ole_beta`, which every train message's config carries as "ole-beta".

    Parameters
    ----------
    sam : bool (default: False)
        False: OledFL-SGD; True: OledFL-SAM (the nodes read "sam-rho" from the config).
    ole_beta : float (default: the run config's)
        Ole's coefficient beta, sent to the nodes as "ole-beta".
    topology, peers, mixing, relay_mixing : as DFedAvg's (default: the run config's)
        The peer topology, k of the random ones, the weights of W, and whether to send mixed sums.
    And the common ones (module docstring).
    """

    def __init__(self, *, sam: bool = False, ole_beta: float = _DEFAULTS.ole_beta, topology: str = _DEFAULTS.topology,
                 peers: int = _DEFAULTS.peers, mixing: str = _DEFAULTS.mixing,
                 relay_mixing: bool = _DEFAULTS.relay_mixing, fraction_evaluate: float = 1.0,
                 min_nodes: int = _DEFAULTS.min_nodes, seed: int = _DEFAULTS.seed,
                 lr_schedule: Callable[[int], float] | None = None, nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY, min_available_nodes: int = 1, **settings: Any) -> None:
        self.algorithm = "oledfl-sam" if sam else "oledfl-sgd"
        super().__init__(topology=topology, peers=peers, mixing=mixing, relay_mixing=relay_mixing,
                         fraction_evaluate=fraction_evaluate, min_nodes=min_nodes, seed=seed, lr_schedule=lr_schedule,
                         nodes=nodes, weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes,
                         ole_beta=ole_beta, **settings)
