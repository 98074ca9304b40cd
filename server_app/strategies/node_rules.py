"""The algorithms whose server is FedAvg's, SCAFFOLD's or MoFedSAM's and whose nodes read their own settings.

FedProx, MOON, FedSAM and FedCOG change only the nodes' rule: the server runs FedAvg and sends the rule's
settings in every train message's config, as Flower's FedProx sends `proximal-mu`. FedGamma is SCAFFOLD's
server with SAM on the nodes, MoFedSAM the server that sends the previous global update with SAM and momentum
on the nodes. Each class takes its rule's settings as typed parameters (their meaning is the run-config key's)
and sends them under the run-config names its nodes read (common/algorithm_table.py `client_keys`).
"""

from __future__ import annotations

from typing import Callable

from flwr.common.typing import Scalar

from common.algorithms.cog_settings import CogSettings
from common.run.aggregation import Aggregation, BoundedInfluence
from common.run.codecs import Codec
from common.algorithms.rule_settings import FedProxSettings, MOONSettings, MoFedSAMSettings, SAMSettings
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.node_table import NodeInfo
from server_app.strategies.parameters import DEFAULTS, documented
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.scaffold import Scaffold
from server_app.wire import WEIGHTED_BY_KEY


@documented
class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg on the server; nodes add the proximal term mu/2 ||w - w_t||^2
    (`fedsynth.client.train_fedprox`), reading mu from the train config's "proximal-mu".
    """

    settings = FedProxSettings


@documented
class MOON(FedAvg):
    """MOON (Li et al., 2021): FedAvg on the server; nodes add the model-contrastive loss, reading
    "moon-mu" and "moon-tau" (the model needs MOON's projection head: a built-in classifier).
    """

    settings = MOONSettings


@documented
class FedSAM(FedAvg):
    """FedSAM (Qu et al., 2022): FedAvg on the server; nodes train with SAM (`fedsynth.client.train_fedsam`),
    reading rho from the train config's "sam-rho".
    """

    settings = SAMSettings


@documented
class FedCOG(FedAvg):
    """FedCOG (Ye et al., 2023): FedAvg on the server; nodes generate complementary data from the global
    model and train with knowledge distillation (`fedsynth.client`'s FedCOG functions) from the round the train
    config's "cog-start-round" names on (FedCOG is client-side only), with the generation and distillation
    settings of `cog_settings` ("gen-budget", "gen-steps", ...: `CogSettings.from_config` reads them).
    """

    def __init__(self, *, cog_start_round: int = DEFAULTS.cog_start_round,
                          cog_settings: CogSettings | None = None,
                          fraction_train: float = DEFAULTS.fraction_train,
                          fraction_evaluate: float = 1.0,
                          min_nodes: int = DEFAULTS.min_nodes,
                          max_failed_rounds: int = DEFAULTS.max_failed_rounds,
                          seed: int = DEFAULTS.seed,
                          server_lr: float = DEFAULTS.server_lr,
                          aggregation: Aggregation = DEFAULTS.aggregation,
                          bounded_influence: BoundedInfluence | None = None,
                          codec: Codec | None = None,
                          node_settings: dict[str, Scalar] | None = None,
                          parameter_names: list[str] | None = None,
                          lr_schedule: Callable[[int], float] | None = None,
                          nodes: list[NodeInfo] | None = None,
                          weighted_by_key: str = WEIGHTED_BY_KEY,
                          min_available_nodes: int = 1) -> None:
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_nodes=min_nodes,
                         max_failed_rounds=max_failed_rounds, seed=seed, server_lr=server_lr, aggregation=aggregation,
                         bounded_influence=bounded_influence, codec=codec, node_settings=node_settings,
                         parameter_names=parameter_names, lr_schedule=lr_schedule, nodes=nodes,
                         weighted_by_key=weighted_by_key, min_available_nodes=min_available_nodes)
        self.cog_start_round = cog_start_round
        self.cog_settings = CogSettings() if cog_settings is None else cog_settings

    def _client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings and what the nodes' rule reads: FedCOG's settings (`cog_settings`) with
        "cog-start-round" the first FedCOG round (0 resolved to the paper's schedule over `start()`'s `num_rounds`,
        once it is known)."""
        start = self.cog_start_round
        if start == 0 and self.num_rounds is not None:
            start = CogSettings(cog_start_round=0).first_cog_round(self.num_rounds)
        return {**super()._client_config(), **self.cog_settings.cog_config(), "cog-start-round": start}


@documented
class MoFedSAM(PreviousUpdateStrategy):
    """MoFedSAM (Qu et al., 2022): the server sends the previous global update ("previous-update"); nodes
    train with SAM and mix in that update as momentum, reading "sam-rho" and "mofedsam-alpha".
    """

    settings = MoFedSAMSettings


@documented
class FedGamma(Scaffold):
    """FedGamma (Dai et al., 2023): SCAFFOLD's server (control variates); nodes train with SAM and the
    SCAFFOLD correction, reading "sam-rho".
    """

    settings = SAMSettings
