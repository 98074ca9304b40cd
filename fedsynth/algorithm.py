"""Your own algorithm, run by fedsynth's apps: `algorithm = "package.module:Name"` in the run config.

fedsynth loads a user's algorithm the way it loads a user's model (`model = "package.module:factory"`):
by import path, without editing fedsynth. `Name` is a module-level `Algorithm`, the same value as a row of
fedsynth's own algorithm table (common/algorithm_table.py), naming its two halves by import path:

    # in the package fednova (tests/plugin_fednova/fednova/__init__.py)
    from fedsynth.algorithm import Algorithm
    FEDNOVA = Algorithm(strategy="fednova.server:FedNova", client="fednova.client:fednova_update")

    # its client rule, shortened from tests/plugin_fednova/fednova/client.py
    from fedsynth.algorithm import LocalJob, LocalResult, plain_rule, run_local_steps
    def fednova_update(job: LocalJob) -> LocalResult:
        result = run_local_steps(job, plain_rule(job))   # K seeded batches of the run's local optimizer
        result.metrics["fednova-tau"] = float(result.num_steps)  # rides in the reply's metrics
        return result

    # pyproject.toml ([tool.flwr.app.config]) or --run-config
    algorithm = "fednova:FEDNOVA"

- `strategy`: a subclass of one of `fedsynth.strategies`' classes (e.g. `FedAvg`). fedsynth's ServerApp
  builds it as it builds its own (server_app/registry.py `build_strategy`): each constructor parameter from
  the run-config key of the same name, the rest at their defaults. A subclass of FedAvg changes its server
  rule by overriding its public hooks, each documented with what it receives and returns (`help(FedAvg)`):
  `server_step(mean_delta, replies)` (the new global model), `downlink_records(server_round)` (records sent
  beside the model), `check_extra_records(content)` with `reply_metrics`/`reply_records` (its reply contract:
  a reply that breaks it is dropped and named, and a first round of nothing but broken replies stops the run
  with `ReplyContractError` quoting `reply_metrics`), and its server state: `state_arrays()` /
  `load_state_arrays(groups)`, `state_meta()` / `load_state_meta(meta)` and `on_resume()`, which a checkpoint
  keeps and a resumed run restores bitwise. The building blocks the built-ins use are the strategy's
  collaborators: `strategy.reply_gate.delta(reply)` (a reply's decoded update),
  `strategy.update_mean.weights(replies)` and `strategy.update_mean.buffers(replies)` (the mean's weights and
  the model's new buffers).
- `client`: `update(job: LocalJob) -> LocalResult`, called by fedsynth's ClientApp for each train message
  after it has evaluated the received model. It trains `job.model` in place (`job.batches()`,
  `job.optimizer`, `job.loss_fn`, `job.num_steps`; `job.cfg` is the run config, `job.incoming` the
  message's content, `job.state` the node's `Context.state`) and returns a `LocalResult`; the ClientApp
  builds the reply from it as for fedsynth's own rules: the model (or with an uplink codec its encoded
  update), `num-examples`, `train-loss`, the step count, `LocalResult.metrics`, and the array records in
  `LocalResult.outgoing`.
- its own settings: a frozen dataclass whose fields are `key(default, meaning, source, side)` and whose
  `check()` calls `require(condition, key, value, accepted)`, set as the strategy class's `settings`: its keys
  are the run-config keys "<name>.<key>" (the class's name in lower case), checked on the server and on every
  node, its `NODE` and `BOTH` fields travel in the train message and its client reads them as `job.own_settings`
  (common/run/own_settings.py); its own server state: `server_state = ("m", "v")` on the strategy class names
  attributes holding {name: numpy array} (or None), which fedsynth's checkpoint keeps and a resume restores
  (server_app/strategies/declared_state.py). tests/plugin_fedadam/ is a complete one, FedAdam.
- `client_keys`: the run-config keys its client reads from the train message's config (existing keys; the
  strategy sends them), and the table's flags (`decentralized`, `with_cog`, `trains_ddpm`, `ddpm_only`) with
  the meanings common/algorithm_table.py gives them.
- its paper's rule (optional), as a built-in row declares one: `rule=PaperRule(server_step=..., mean_source=...,
  source=..., keys=(...), regime=...)`, what the paper does with the mean of the updates, where it fixes the mean
  (`mean`), where its defaults come from, the shared run-config keys whose default its paper fixes too (its own
  settings' keys are its hyper-parameters already) and where its training recipe differs from the shared
  defaults. It is checked with the halves (each key a run-config key, or the run stops naming it), and
  `python -m common.run.config_docs --algorithm package.module:Name` shows it beside its own keys, as
  docs/algorithms.md's paper-rule table shows a built-in's:

      FEDADAM = Algorithm(strategy="fedadam.server:FedAdam", client="fedadam.client:fedadam_update",
                          rule=PaperRule("Adam on the mean update: w + eta m / (sqrt(v) + tau)",
                                         "FedAvg's sample weights", "Reddi et al., 2021, Algorithm 2"))

The module and both halves are imported when the run config is parsed, on the server and on every node,
so a missing module, attribute or a value of the wrong type is a ConfigError naming the path before any
round. The package must be importable on the server and on every SuperNode, as a model's package must:
inside the Flower app directory that `flwr run` ships, installed on every host, or on the PYTHONPATH of the
SuperLink's and SuperNodes' processes (docs/architecture.md, "An algorithm", has the whole checklist and the
FedNova plugin that tests it).
"""

from __future__ import annotations

from client_app.training import LocalJob, LocalResult, plain_rule, run_local_steps
from common.algorithm_table import Algorithm, PaperRule
from common.keys import BOTH, NODE, SERVER, key, require
from common.run.client_settings import config_value

__all__ = ["BOTH", "NODE", "SERVER", "Algorithm", "LocalJob", "LocalResult", "PaperRule", "config_value", "key",
           "plain_rule", "require", "run_local_steps"]
