"""fedsynth's local update rules for your own Flower ClientApp: a model, batches and plain parameters in, a result out.

Every rule that fedsynth's own ClientApp runs is here as one function. It
takes a torch model, an iterable of `(inputs, labels)` batches (a
`torch.utils.data.DataLoader`, or `tensor_batches(x, y, ...)`), the rule's
parameters as numbers, and a `LocalOptimizer` (SGD with momentum, or Adam).
No run config, no Flower records, no `Context`: your ClientApp reads its
message, calls the function, and builds its reply. fedsynth's ClientApp calls
these same functions (client_app/updates.py, sam_family.py, decentralized.py,
fedcog.py and train_reply.py adapt the train message and the node's records to
them), so a rule here is exactly the rule fedsynth's experiments run.

The settings a rule needs (the round's learning rate, rho, beta, the uplink codec,
FedCOG's settings, Ole's beta) arrive in the train message's config, under
their run-config names, from every strategy of `fedsynth.strategies`: read them
a rule's settings group with `rule_settings(msg.content["config"], SAMSettings)`
(checked as the run config checks its keys; `.sam_rho` is SAM's radius), the codec (a `CodecSettings`) with
`message_codec(msg.content["config"])`, as fedsynth's own ClientApp
does; FedCOG's `CogSettings` is the run config's FedCOG part
(`CogSettings.from_config(msg.content["config"])` reads what fedsynth's app sends).

Train functions change `model` in place and return a `TrainResult`
(`train_loss`, `num_steps`, `metrics`). Where a rule carries state from one
round to the next on the node, the function takes it as an argument (None on
the node's first round) and returns it in a subclass of `TrainResult`: keep it
in `Context.state` (for example `context.state["c_i"] = ArrayRecord(...)`).
Weights are dicts of numpy arrays keyed by parameter name, as
`{k: v.numpy() for k, v in record.to_torch_state_dict().items()}` gives.

Replies: `train_reply(msg, model, result, num_examples=n)` builds the reply
every centralized strategy reads (the model, or with an uplink codec on the
compressed update of the parameters and the buffers as they are, the metrics
and the rule's extra record); `scaffold_reply` is SCAFFOLD's; `warmup_reply`
and `feature_sums_reply` answer FedDDPM's two phases outside the rounds.

docs/library.md lists every function with its parameters, what it needs from
the server and what its reply should carry, and walks through the example app
in examples/fedcog-app/.
"""

from __future__ import annotations

from client_app.fedcog import (
    FedCogResult,
    GeneratedSet,
    KnowledgeDistillation,
    fedcog_distillation,
    generate,
    train_fedcog,
)
from client_app.rules import (
    DynamicResult,
    MoonResult,
    ScaffoldResult,
    SmooResult,
    gossip_mix,
    ole_restart,
    train_fedgamma,
    train_fedlesam,
    train_fedlesam_d,
    train_fedlesam_s,
    train_fedprox,
    train_fedsam,
    train_fedsmoo,
    train_fedsynsam,
    train_mofedsam,
    train_moon,
    train_scaffold,
    train_sgd,
)
from client_app.diffusion_library import (
    build_unet,
    feature_sums_reply,
    is_warmup,
    train_ddpm,
    warmup_length,
    warmup_reply,
)
from client_app.replies import (
    CompressedUpdate,
    compressed_update_records,
    result_records,
    scaffold_reply,
    train_reply,
)
from client_app.training import (
    LocalOptimizer,
    TrainResult,
    classification_loss,
    epochs,
    tensor_batches,
    train_steps,
    with_loss_plugin,
)
from common.uplink.encoding import EncodedUpdate
from common.uplink.encoding import encode_delta as encode_update
from common.run.client_settings import config_value, message_codec, rule_settings
from common.algorithms.rule_settings import (
    DFedAvgMSettings, FedDynSAMSettings, FedProxSettings, MOONSettings, MoFedSAMSettings, OledFLSettings, SAMSettings,
)
from common.algorithms.synsam_settings import SynSAMRuleSettings
from common.uplink.payloads import decode_update
from common.algorithms.codec_settings import CodecSettings
from common.metrics.evaluation import evaluate_model
from common.algorithms.cog_settings import CogSettings
from common.algorithms.fedcog import complementary_labels, kd_coefficients
from common.protocol import COMPRESSED_UPDATE, DYNAMIC_CORRECTION, PERTURBATION_DUAL, SCAFFOLD_CONTROL_DELTA
from common.uplink.wire import MODEL_BUFFERS

__all__ = [
    # the local training loop and its inputs
    "LocalOptimizer",
    "TrainResult",
    "classification_loss",
    "epochs",
    "tensor_batches",
    "train_steps",
    "with_loss_plugin",
    "evaluate_model",
    # FedAvg, FedProx and the SAM family
    "train_sgd",
    "train_fedprox",
    "train_fedsam",
    "train_mofedsam",
    "train_fedlesam",
    "train_fedlesam_d",
    "train_fedlesam_s",
    "train_fedgamma",
    "train_fedsmoo",
    "DynamicResult",
    "SmooResult",
    # FedSynSAM's mixed ascent
    "train_fedsynsam",
    # SCAFFOLD and MOON
    "train_scaffold",
    "ScaffoldResult",
    "train_moon",
    "MoonResult",
    # FedCOG: generation and distillation
    "CogSettings",
    "fedcog_distillation",
    "train_fedcog",
    "FedCogResult",
    "KnowledgeDistillation",
    "GeneratedSet",
    "generate",
    "complementary_labels",
    "kd_coefficients",
    # decentralized FL: mixing and OledFL's restart
    "gossip_mix",
    "ole_restart",
    # the settings the server's strategy sends in the train message's config
    "config_value",
    "message_codec",
    "rule_settings",
    # the node rules' settings groups (common/algorithms/rule_settings.py), read with `rule_settings`
    "DFedAvgMSettings",
    "FedDynSAMSettings",
    "FedProxSettings",
    "MOONSettings",
    "MoFedSAMSettings",
    "OledFLSettings",
    "SAMSettings",
    "SynSAMRuleSettings",
    # the compressed uplink
    "encode_update",
    "EncodedUpdate",
    "decode_update",
    "CodecSettings",
    "COMPRESSED_UPDATE",
    "MODEL_BUFFERS",
    # the train replies, per strategy family (plain, compressed, SCAFFOLD's and the dynamic rules')
    "train_reply",
    "scaffold_reply",
    "compressed_update_records",
    "CompressedUpdate",
    "result_records",
    "SCAFFOLD_CONTROL_DELTA",
    "DYNAMIC_CORRECTION",
    "PERTURBATION_DUAL",
    # FedDDPM / FedDDPM+: the U-Net, the DDPM step and the phases' replies
    "build_unet",
    "train_ddpm",
    "is_warmup",
    "warmup_length",
    "warmup_reply",
    "feature_sums_reply",
]
