"""fedsynth's server strategies as Flower strategies, for a Flower developer's own ServerApp.

Each class is a Flower `Strategy` built from its own typed keyword parameters (no `**kwargs`), each listed
with its default in the class docstring, as Flower's `FedAvg` does (`help(FedSynSAM)` shows them), and run
with Flower's own `start()`, which returns Flower's `Result`:

    from fedsynth.strategies import FedSynSAM
    strategy = FedSynSAM(fraction_train=1.0, trajectory_rounds=30, synthetic_ipc=20, compression="qsgd", bits=4)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=100,
                            train_config=ConfigRecord({"lr": 0.05}), evaluate_fn=central_evaluate)

A class takes only what its server uses or sends: the round's sampling and checks, the aggregation, the
settings its nodes' rule reads from the train message's config (the uplink codec, SAM's rho, ...; see
common/run/client_settings.py), and, where the server itself builds the model (FedSynSAM's and DynaFed's
distillation, FedDDPM's sampling), the model and the data's shape. Each default is the run config's
(common/run/config.py), so the public classes and `fedsynth run` share one set of defaults.

Which algorithm each class runs, and which settings it sends its nodes, is common/algorithm_table.py's table
(`Algorithm.public_class`, `Algorithm.client_keys`), shared with fedsynth's registry and client rules.

Inside, a class still assembles fedsynth's `RunConfig` from its parameters and hands it to the strategy
fedsynth's own ServerApp runs (server_app/strategies/); taking the run config out of the strategies'
internals is a later step. The parameters' meanings are defined once (`PARAMETER_DOCS`) and written into each
class docstring with the class's own defaults.

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

import inspect
from typing import Any, Callable

from common.run.config import RunConfig, key_name, parse_run_config
from server_app.strategies.relay import DecentralizedRelay
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

_D = RunConfig()  # the run config's defaults: every class's defaults are these (docs/configuration.md)

# the parameters a strategy keeps itself rather than passing into its run config
_STRATEGY_ARGUMENTS = ("nodes", "fraction_evaluate", "lr_schedule", "weighted_by_key", "min_available_nodes")

# What each keyword parameter means, defined once; `_documented` writes the entries of a class's own
# parameters, with the class's defaults, into its docstring (Flower's `name : type (default: value)` layout).
PARAMETER_DOCS: dict[str, str] = {
    # the round: sampling, checks, bounded influence
    "fraction_train": "Fraction of the nodes sampled for training each round (at least one).",
    "fraction_evaluate": "Fraction of the nodes sent an evaluate message after each round. A round whose train replies\n"
                         "all carried `local-test-accuracy` (the received model's evaluation, as fedsynth's clients do)\n"
                         "sends none, and the carried numbers become the round's evaluate metrics.",
    "min_nodes": "Fewest good train replies a round needs; with fewer the model stays unchanged.",
    "max_failed_rounds": "Rounds in a row below `min_nodes` after which `start()` raises `TooManyFailedRounds`.",
    "seed": "Seed of the node sampling and of the server's own random draws (the same seed, the same run).",
    "lr_schedule": "If given, each round's train config carries \"lr\" = lr_schedule(server_round); else `start()`'s\n"
                   "`train_config` decides.",
    "nodes": "A node table (node ids with partition ids and example counts, as fedsynth's handshake learns it);\n"
             "None numbers the grid's nodes in node-id order, and every round adds the nodes that joined since.",
    "weighted_by_key": "The reply metric that weighs each reply in the averages, as in Flower's strategies.",
    "min_available_nodes": "Each round waits until the grid has at least this many nodes, as Flower's strategies do.",
    # aggregation
    "server_lr": "The server step: w <- w + server_lr * mean(w_i - w).",
    "aggregation": "\"weighted\" (by `weighted_by_key`), \"uniform\", or the robust \"median\", \"trimmed-mean\", \"krum\".",
    "trim_fraction": "\"trimmed-mean\": the fraction of the highest and of the lowest values dropped per coordinate.",
    "byzantine_nodes": "\"krum\": f, the number of faulty nodes Krum tolerates.",
    "max_weight_share": "No node's share of a weighted mean above this (bounded influence; 1.0 leaves the counts).",
    "max_update_norm": "Bound on a node's update norm (0: none); `update_norm_action` says what happens to longer ones.",
    "max_update_norm_ratio": "Clip each update to this multiple of the round's lower-median update norm (0: off); "
                             "with the default, one node's scaled update cannot move the model far (docs/reliability.md).",
    "update_norm_action": "\"clip\" scales an over-long update (or extra record) to the bound, \"refuse\" drops the reply.",
    "max_record_norm": "Bound on the norm of a node's extra record (control-variate delta, correction; 0: none).",
    # the uplink codec: sent in the train config, and the server decodes with it
    "compression": "The uplink codec the nodes use (\"none\", \"qsgd\", \"topk\"), sent as \"compression\"; the server\n"
                   "decodes the replies with it. Buffers travel uncompressed.",
    "bits": "qsgd: bits per coordinate on the wire, sent as \"bits\".",
    "levels": "qsgd: the number of levels s, overriding `bits` (0: from `bits`), sent as \"levels\".",
    "qsgd_scope": "qsgd: one norm per \"tensor\", per \"model\" or per \"bucket\" of `qsgd_bucket` coordinates (\"qsgd-scope\").",
    "qsgd_bucket": "qsgd-scope \"bucket\": coordinates per bucket, sent as \"qsgd-bucket\".",
    "topk_ratio": "topk: the fraction of coordinates a node sends, sent as \"topk-ratio\".",
    "error_feedback": "Whether the nodes keep the compression error and add it to the next update (\"error-feedback\").",
    # the nodes' rules: sent in every train message's config
    "sam_rho": "SAM's radius rho of the nodes' perturbation, sent as \"sam-rho\".",
    "mofedsam_alpha": "MoFedSAM: weight of the local step against the global momentum, sent as \"mofedsam-alpha\".",
    "dyn_alpha": "FedDyn's alpha (the server's correction and the nodes' penalty), sent as \"dyn-alpha\".",
    "cog_start_round": "The first round in which the nodes generate and distil (0: the paper's schedule), sent as\n"
                       "\"cog-start-round\".",
    "synsam_beta": "Weight of the local gradient in the nodes' ascent direction, sent as \"synsam-beta\".",
    "synsam_mix": "How the nodes mix the local and the synthetic gradient (\"paper\", ...), sent as \"synsam-mix\".",
    "server_momentum": "Momentum of the server's update.",
    # the server's own model: distillation, server training, sampling
    "model": "The model the server builds: a preset name (docs/configuration.md) or \"package.module:factory\".",
    "dataset": "The data whose shape the server's model takes (a dataset name, or \"hf:...\").",
    "data_dir": "Where `dataset` lies, when its shape is read from the files (\"\": the default folder).",
    "image_channels": "Image channels of the data (0: from `dataset`).",
    "image_size": "Image side of the data (0: from `dataset`).",
    "num_classes": "Number of classes of the data (0: from `dataset`).",
    "device": "Where the server's own computation runs (\"auto\", \"cpu\", \"cuda\", ...).",
    "trajectory_rounds": "R, the aggregations recorded before the distillation.",
    "synthetic_ipc": "Synthetic images per class.",
    "distill_iterations": "Iterations of the trajectory-matching distillation.",
    "distill_optimizer": "Optimizer of the synthetic images (\"auto\": Adam for grey images, else SGD).",
    "distill_inner_steps": "Steps of the student per distillation iteration (0: 3 for grey images, else 5).",
    "distill_lr": "Learning rate of the synthetic images (0: from the optimizer).",
    "distill_alpha_init": "Initial value of the learnt student learning rate.",
    "distill_alpha_lr": "Learning rate of the learnt student learning rate.",
    "dynafed_lr": "Learning rate of the server's training on the synthetic set.",
    "dynafed_epochs": "Epochs of the server's training on the synthetic set each round (0: none).",
    "batch_size": "Batch size of the server's own training.",
    # diffusion (FedDDPM, FedDDPM+)
    "diffusion_timesteps": "T of the diffusion (0: the U-Net preset's).",
    "aux_sampler": "The sampler of the auxiliary set (\"ddpm\" ancestral, as the paper, or \"ddim\").",
    "sampler": "The sampler of QuickTest's images (\"ddpm\" or \"ddim\").",
    "ddim_steps": "Steps of the DDIM sampler.",
    "local_optimizer": "Optimizer of the server's corrections (\"auto\": Adam for the diffusion task).",
    "warmup_epochs": "Epochs of each node's warm-up, sent in the warm-up message.",
    "warmup_steps": "Steps of each node's warm-up, overriding `warmup_epochs` (0: epochs).",
    "warmup_timeout": "Seconds the server waits for the warm-up replies.",
    "aux_fraction": "Auxiliary images per node, as a fraction of its example count.",
    "correction_epochs": "Server epochs on the auxiliary set after each aggregation.",
    "correction_lr": "Learning rate of those epochs.",
    "quicktest_every": "Rounds between QuickTests.",
    "quicktest_size": "Images QuickTest samples.",
    "quicktest_gamma": "QuickTest's smoothing of its score.",
    "quicktest_threshold": "QuickTest's threshold: a smoothed change below it stops the rounds.",
    "quicktest_reference": "What QuickTest compares with: \"auxiliary\" (the auxiliary set) or \"clients\" (statistics\n"
                           "the nodes send).",
    "fid_features": "The features QuickTest's FID uses (\"classifier\", \"random\", ...).",
    "cache_dir": "Where the \"classifier\" features' classifier, trained once on `dataset`, is cached (\"\": the default).",
    "oneshot_epochs": "Epochs of the one-shot correction.",
    "oneshot_lr": "Learning rate of the one-shot correction (0: `train_config`'s \"lr\").",
    # decentralized
    "topology": "The peer topology: \"ring\", \"random\" (k-regular, redrawn each round from (seed, round)), \"full\", ...",
    "peers": "k of the random topologies.",
    "mixing": "Weights of the mixing matrix W (\"metropolis\", \"uniform\").",
    "relay_mixing": "Send each node the weighted sum of its neighbours' models instead of each model.",
    "sam": "False: OledFL-SGD; True: OledFL-SAM (the nodes read \"sam-rho\" from the config).",
    "ole_beta": "Ole's coefficient beta, sent to the nodes as \"ole-beta\".",
}


def run_config(algorithm: str, settings: dict[str, Any]) -> RunConfig:
    """The validated run config of `algorithm` with `settings` (Python names of run-config keys) over the defaults.

    Raises TypeError for a name that is no run-config key, and common.run.config.ConfigError for a bad value.
    """
    known = {f for f in vars(_D)}
    unknown = sorted(name for name in settings if name not in known)
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown}: not run-config keys (docs/configuration.md)")
    raw = {"algorithm": algorithm, **{key_name(name): value for name, value in settings.items()}}
    return parse_run_config(raw, [algorithm])


def _build(strategy: RoundStrategy, parent: type, algorithm: str, arguments: dict[str, Any]) -> None:
    """Initialise `parent`'s part of `strategy` from a public class's keyword `arguments` (its `locals()`).

    The strategy's own arguments go to `parent.__init__`; the rest are run-config keys, assembled into the
    run config `parent` is built from (the module docstring says why). The round's lr comes from the train
    config or `lr_schedule`.
    """
    settings = {name: value for name, value in arguments.items() if name not in ("self", "__class__", "sam")}
    own = {name: settings.pop(name) for name in _STRATEGY_ARGUMENTS}
    parent.__init__(strategy, run_config(algorithm, settings), own["nodes"],
                    fraction_evaluate=own["fraction_evaluate"], weighted_by_key=own["weighted_by_key"],
                    min_available_nodes=own["min_available_nodes"])
    strategy.lr_schedule = own["lr_schedule"]


def parameter_section(cls: type) -> str:
    """The "Parameters" section of `cls`'s docstring: each keyword parameter with its type, default and meaning."""
    lines = ["Parameters", "----------"]
    for parameter in inspect.signature(cls).parameters.values():
        default = parameter.default
        shown = getattr(default, "__name__", None) or repr(default)
        lines.append(f"{parameter.name} : {parameter.annotation} (default: {shown})")
        lines.extend("    " + line.strip() for line in PARAMETER_DOCS[parameter.name].splitlines())
    return "\n".join(lines)


def _documented(cls: type) -> type:
    """Append the class's parameter section to its docstring, so that `help(cls)` lists every parameter."""
    section = "\n".join("    " + line if line else "" for line in parameter_section(cls).splitlines())
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + section + "\n"
    return cls


@_documented
class FedAvg(FedAvgStrategy):
    """FedAvg (McMahan et al., 2017) with fedsynth's reply checks, seeded sampling and bounded influence.

    Nodes train with any rule (`fedsynth.client.train_sgd`, or a Flower template's own train function).
    """

    def __init__(self, *, fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedAvgStrategy, "fedavg", locals())


@_documented
class FedSAM(FedAvgStrategy):
    """FedSAM (Qu et al., 2022): FedAvg on the server; nodes train with SAM (`fedsynth.client.train_fedsam`),
    reading rho from the train config's "sam-rho".
    """

    def __init__(self, *, sam_rho: float = _D.sam_rho,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedAvgStrategy, "fedsam", locals())


@_documented
class FedCOG(FedAvgStrategy):
    """FedCOG (Ye et al., 2023): FedAvg on the server; nodes generate complementary data from the global
    model and train with knowledge distillation (`fedsynth.client`'s FedCOG functions) from the round the train
    config's "cog-start-round" names on (FedCOG is client-side only).
    """

    def __init__(self, *, cog_start_round: int = _D.cog_start_round,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedAvgStrategy, "fedcog", locals())


@_documented
class FedAvgM(FedAvgMStrategy):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum.
    """

    def __init__(self, *, server_momentum: float = _D.server_momentum,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedAvgMStrategy, "fedavgm", locals())


@_documented
class Scaffold(ScaffoldStrategy):
    """SCAFFOLD (Karimireddy et al., 2020): sends the server control variate c, averages the nodes' c_i updates.

    Nodes reply with "scaffold-delta-c" (c_i+ - c_i) beside the model (`fedsynth.client.train_scaffold`).
    """

    def __init__(self, *, fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 max_record_norm: float = _D.max_record_norm,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, ScaffoldStrategy, "scaffold", locals())


@_documented
class MoFedSAM(PreviousUpdateStrategy):
    """MoFedSAM (Qu et al., 2022): FedAvg that also sends the previous global update for the nodes' momentum.
    """

    def __init__(self, *, sam_rho: float = _D.sam_rho,
                 mofedsam_alpha: float = _D.mofedsam_alpha,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, PreviousUpdateStrategy, "mofedsam", locals())


@_documented
class FedLESAM(FedLESAMStrategy):
    """FedLESAM (Fan et al., 2024): sends the previous global update, the nodes' perturbation direction.
    """

    def __init__(self, *, sam_rho: float = _D.sam_rho,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedLESAMStrategy, "fedlesam", locals())


@_documented
class FedLESAMD(FedLESAMDStrategy):
    """FedLESAM-D: FedDyn's server that also sends the previous global update.
    """

    def __init__(self, *, dyn_alpha: float = _D.dyn_alpha,
                 sam_rho: float = _D.sam_rho,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 max_record_norm: float = _D.max_record_norm,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedLESAMDStrategy, "fedlesam-d", locals())


@_documented
class FedSMOO(FedSMOOStrategy):
    """FedSMOO (Sun et al., 2023): FedDyn's server plus the global perturbation from the nodes' corrections.
    """

    def __init__(self, *, dyn_alpha: float = _D.dyn_alpha,
                 sam_rho: float = _D.sam_rho,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 max_record_norm: float = _D.max_record_norm,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedSMOOStrategy, "fedsmoo", locals())


@_documented
class FedSynSAM(FedSynSAMStrategy):
    """FedSynSAM: FedAvg of (compressed) updates; after `trajectory_rounds` aggregations the server distils a
    synthetic set from the global-model trajectory and sends it once to every node, which then perturbs along
    the local/synthetic gradient mix (`fedsynth.client.train_fedsynsam`).

    The distillation builds the model on the server: `model` (a preset name or "package.module:factory")
    and the data's shape (`dataset`, or `image_channels`, `image_size`, `num_classes`).
    """

    def __init__(self, *, trajectory_rounds: int = _D.trajectory_rounds,
                 synthetic_ipc: int = _D.synthetic_ipc,
                 distill_iterations: int = _D.distill_iterations,
                 distill_optimizer: str = _D.distill_optimizer,
                 distill_inner_steps: int = _D.distill_inner_steps,
                 distill_lr: float = _D.distill_lr,
                 distill_alpha_init: float = _D.distill_alpha_init,
                 distill_alpha_lr: float = _D.distill_alpha_lr,
                 sam_rho: float = _D.sam_rho,
                 synsam_beta: float = _D.synsam_beta,
                 synsam_mix: str = _D.synsam_mix,
                 model: str = _D.model,
                 dataset: str = _D.dataset,
                 data_dir: str = _D.data_dir,
                 image_channels: int = _D.image_channels,
                 image_size: int = _D.image_size,
                 num_classes: int = _D.num_classes,
                 device: str = _D.device,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedSynSAMStrategy, "fedsynsam", locals())


@_documented
class DynaFed(DynaFedStrategy):
    """DynaFed (Pi et al., 2023): FedAvg plus server training on the trajectory-distilled synthetic set.

    The distillation and the server training build the model on the server, as FedSynSAM's.
    """

    def __init__(self, *, trajectory_rounds: int = _D.trajectory_rounds,
                 synthetic_ipc: int = _D.synthetic_ipc,
                 distill_iterations: int = _D.distill_iterations,
                 distill_optimizer: str = _D.distill_optimizer,
                 distill_inner_steps: int = _D.distill_inner_steps,
                 distill_lr: float = _D.distill_lr,
                 distill_alpha_init: float = _D.distill_alpha_init,
                 distill_alpha_lr: float = _D.distill_alpha_lr,
                 dynafed_lr: float = _D.dynafed_lr,
                 dynafed_epochs: int = _D.dynafed_epochs,
                 batch_size: int = _D.batch_size,
                 model: str = _D.model,
                 dataset: str = _D.dataset,
                 data_dir: str = _D.data_dir,
                 image_channels: int = _D.image_channels,
                 image_size: int = _D.image_size,
                 num_classes: int = _D.num_classes,
                 device: str = _D.device,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, DynaFedStrategy, "dynafed", locals())


@_documented
class FedDDPM(FedDDPMStrategy):
    """FedDDPM: FedAvg of DDPMs, corrected on the server with an auxiliary set sampled from the nodes' warm DDPMs.

    Under `start()` its first `configure_train` runs the warm-up (every node trains its own DDPM and uploads
    it once; the server samples the auxiliary set); every aggregation is then followed by `correction_epochs`
    on that set. The record of the warm-up is in `phase_records`. The server builds the DDPM from `model` and
    the image shape (`dataset`, or `image_channels`, `image_size`).
    """

    def __init__(self, *, model: str = _D.model,
                 dataset: str = _D.dataset,
                 data_dir: str = _D.data_dir,
                 image_channels: int = _D.image_channels,
                 image_size: int = _D.image_size,
                 diffusion_timesteps: int = _D.diffusion_timesteps,
                 aux_sampler: str = _D.aux_sampler,
                 ddim_steps: int = _D.ddim_steps,
                 batch_size: int = _D.batch_size,
                 local_optimizer: str = _D.local_optimizer,
                 device: str = _D.device,
                 warmup_epochs: int = _D.warmup_epochs,
                 warmup_steps: int = _D.warmup_steps,
                 warmup_timeout: float = _D.warmup_timeout,
                 aux_fraction: float = _D.aux_fraction,
                 correction_epochs: int = _D.correction_epochs,
                 correction_lr: float = _D.correction_lr,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedDDPMStrategy, "fedddpm", locals())


@_documented
class FedDDPMPlus(FedDDPMPlusStrategy):
    """FedDDPM+: FedDDPM's warm-up, FedAvg rounds with QuickTest every `quicktest_every` rounds, then a one-shot
    correction on the auxiliary set and a stop: later rounds of `start()` send nothing. The one-shot
    correction comes at `start()`'s `num_rounds` (or earlier when QuickTest fires), at `oneshot_lr` or else
    `train_config`'s "lr".
    """

    def __init__(self, *, model: str = _D.model,
                 dataset: str = _D.dataset,
                 data_dir: str = _D.data_dir,
                 image_channels: int = _D.image_channels,
                 image_size: int = _D.image_size,
                 diffusion_timesteps: int = _D.diffusion_timesteps,
                 aux_sampler: str = _D.aux_sampler,
                 ddim_steps: int = _D.ddim_steps,
                 batch_size: int = _D.batch_size,
                 local_optimizer: str = _D.local_optimizer,
                 device: str = _D.device,
                 warmup_epochs: int = _D.warmup_epochs,
                 warmup_steps: int = _D.warmup_steps,
                 warmup_timeout: float = _D.warmup_timeout,
                 aux_fraction: float = _D.aux_fraction,
                 quicktest_every: int = _D.quicktest_every,
                 quicktest_size: int = _D.quicktest_size,
                 quicktest_gamma: float = _D.quicktest_gamma,
                 quicktest_threshold: float = _D.quicktest_threshold,
                 quicktest_reference: str = _D.quicktest_reference,
                 sampler: str = _D.sampler,
                 fid_features: str = _D.fid_features,
                 cache_dir: str = _D.cache_dir,
                 oneshot_epochs: int = _D.oneshot_epochs,
                 oneshot_lr: float = _D.oneshot_lr,
                 fraction_train: float = _D.fraction_train,
                 server_lr: float = _D.server_lr,
                 aggregation: str = _D.aggregation,
                 trim_fraction: float = _D.trim_fraction,
                 byzantine_nodes: int = _D.byzantine_nodes,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 max_update_norm_ratio: float = _D.max_update_norm_ratio,
                 update_norm_action: str = _D.update_norm_action,
                 compression: str = _D.compression,
                 bits: int = _D.bits,
                 levels: int = _D.levels,
                 qsgd_scope: str = _D.qsgd_scope,
                 qsgd_bucket: int = _D.qsgd_bucket,
                 topk_ratio: float = _D.topk_ratio,
                 error_feedback: bool = _D.error_feedback,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, FedDDPMPlusStrategy, "fedddpm+", locals())


@_documented
class DFedAvg(DecentralizedRelay):
    """Decentralized FedAvg over a peer topology: `configure_train` sends each node its own message (its mixing
    weights and its neighbours' last models, or their weighted sum with `relay_mixing`); `aggregate_train`
    keeps each reply as that node's model and returns their average x-bar. All nodes train every round
    (`fedsynth.client.gossip_mix`, then `fedsynth.client.train_sgd`); docs/library.md describes the message layout.
    """

    def __init__(self, *, topology: str = _D.topology,
                 peers: int = _D.peers,
                 mixing: str = _D.mixing,
                 relay_mixing: bool = _D.relay_mixing,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 update_norm_action: str = _D.update_norm_action,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, DecentralizedRelay, "dfedavg", locals())


@_documented
class OledFL(DFedAvg):
    """OledFL (Li et al., 2024): DFedAvg's relay; each node restarts from an "opposite lookahead" of its model
    (`fedsynth.client.ole_restart`) with the train config's "ole-beta", then trains with SGD or, with
    `sam`, with SAM at the config's "sam-rho".
    """

    def __init__(self, *, sam: bool = False,
                 ole_beta: float = _D.ole_beta,
                 sam_rho: float = _D.sam_rho,
                 topology: str = _D.topology,
                 peers: int = _D.peers,
                 mixing: str = _D.mixing,
                 relay_mixing: bool = _D.relay_mixing,
                 max_weight_share: float = _D.max_weight_share,
                 max_update_norm: float = _D.max_update_norm,
                 update_norm_action: str = _D.update_norm_action,
                 fraction_evaluate: float = 1.0,
                 min_nodes: int = _D.min_nodes,
                 max_failed_rounds: int = _D.max_failed_rounds,
                 seed: int = _D.seed,
                 lr_schedule: Callable[[int], float] | None = None,
                 nodes: list[NodeInfo] | None = None,
                 weighted_by_key: str = WEIGHTED_BY_KEY,
                 min_available_nodes: int = 1) -> None:
        _build(self, DecentralizedRelay, "oledfl-sam" if sam else "oledfl-sgd", locals())

