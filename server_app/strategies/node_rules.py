"""The algorithms whose server is FedAvg's, SCAFFOLD's or MoFedSAM's and whose nodes read their own settings.

FedProx, MOON, FedSAM and FedCOG change only the nodes' rule: the server runs FedAvg and sends the rule's
settings in every train message's config, as Flower's FedProx sends its weight mu. FedGamma is SCAFFOLD's
server with SAM on the nodes, MoFedSAM the server that sends the previous global update with SAM and momentum
on the nodes. Each class declares its rule's settings group (`settings`, common/algorithms/rule_settings.py),
which gives it the group's fields as typed parameters and sends them under the run-config names its nodes read.
"""

from __future__ import annotations

from flwr.common.typing import Scalar

from common.algorithms.cog_settings import COG_START_KEY, CogSettings, FedCOGClassSettings
from common.algorithms.rule_settings import FedProxSettings, MOONSettings, MoFedSAMSettings, SAMSettings
from server_app.strategies.fedavg import FedAvg
from server_app.strategies.parameters import documented
from server_app.strategies.previous_update import PreviousUpdateStrategy
from server_app.strategies.scaffold import Scaffold


@documented
class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg on the server; nodes add the proximal term mu/2 ||w - w_t||^2
    (`fedsynth.client.train_fedprox`), reading mu from the train config (`FedProxSettings`).
    """

    settings = FedProxSettings


@documented
class MOON(FedAvg):
    """MOON (Li et al., 2021): FedAvg on the server; nodes add the model-contrastive loss, reading
    its weight and temperature (`MOONSettings`; the model needs MOON's projection head: a built-in classifier).
    """

    settings = MOONSettings


@documented
class FedSAM(FedAvg):
    """FedSAM (Qu et al., 2022): FedAvg on the server; nodes train with SAM (`fedsynth.client.train_fedsam`),
    reading rho from the train config (`SAMSettings`).
    """

    settings = SAMSettings


@documented
class FedCOG(FedAvg):
    """FedCOG (Ye et al., 2023): FedAvg on the server; nodes generate complementary data from the global
    model and train with knowledge distillation (`fedsynth.client`'s FedCOG functions) from the first FedCOG round
    the train config names on (FedCOG is client-side only), with the generation and distillation
    settings of `cog_settings` (a `CogSettings`, sent under its keys: `CogSettings.from_config` reads them).
    """

    settings = FedCOGClassSettings

    def __post_init__(self) -> None:
        if self.cog_settings is None:
            self.cog_settings = CogSettings()

    def client_config(self) -> dict[str, Scalar]:
        """FedAvg's settings and what the nodes' rule reads: FedCOG's settings (`cog_settings`) with
        the first FedCOG round (`COG_START_KEY`; 0 resolved to the paper's schedule over `start()`'s `num_rounds`,
        once it is known)."""
        start = self.cog_start_round
        if start == 0 and self.num_rounds is not None:
            start = CogSettings(cog_start_round=0).first_cog_round(self.num_rounds)
        return {**super().client_config(), **self.cog_settings.cog_config(), COG_START_KEY: start}


@documented
class MoFedSAM(PreviousUpdateStrategy):
    """MoFedSAM (Qu et al., 2022): the server sends the previous global update ("previous-update"); nodes
    train with SAM and mix in that update as momentum, reading rho and alpha (`MoFedSAMSettings`).
    """

    settings = MoFedSAMSettings


@documented
class FedGamma(Scaffold):
    """FedGamma (Dai et al., 2023): SCAFFOLD's server (control variates); nodes train with SAM and the
    SCAFFOLD correction, reading rho (`SAMSettings`).
    """

    settings = SAMSettings
