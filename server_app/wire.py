"""Flower's wire conventions beside fedsynth's: reply metric names, the weighting key, the contract error.

A ClientApp written from `flwr new`'s PyTorch template replies to a train
message with `{"train_loss": ..., "num-examples": n}` and to an evaluate
message with `{"eval_loss": ..., "eval_acc": ..., "num-examples": n}`;
Flower's strategies weigh replies by the metric named `weighted_by_key`
(default "num-examples"). fedsynth's clients send `train-loss`,
`local-test-loss` and `local-test-accuracy`. The server reads both: a reply
that carries only Flower's name is read as if it carried fedsynth's, so such
a ClientApp runs with fedsynth's strategies unchanged.

A reply that breaks the contract (a missing metric or record, a mis-shaped
array) is dropped like a failed one. When every reply of the first round is
dropped so, no later round can go better: the ClientApp itself must change.
`contract_violation_error` says what to change instead of letting the run
repeat the round `max_failed_rounds` times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord

WEIGHTED_BY_KEY = "num-examples"  # Flower's default weighting key, and the count every fedsynth reply carries

# Flower's `flwr new` PyTorch template name -> fedsynth's name of the same metric
FLOWER_METRIC_NAMES: dict[str, str] = {
    "train_loss": "train-loss",
    "eval_loss": "local-test-loss",
    "eval_acc": "local-test-accuracy",
}


def with_fedsynth_metric_names(metrics: MetricRecord) -> MetricRecord:
    """`metrics` with fedsynth's name added for every Flower template name it carries alone.

    The record is returned as it is when there is nothing to add (a fedsynth reply), so fedsynth's own
    runs read the very record their clients sent.
    """
    missing = {ours: flower for flower, ours in FLOWER_METRIC_NAMES.items() if flower in metrics and ours not in metrics}
    if not missing:
        return metrics
    return MetricRecord({**dict(metrics), **{ours: metrics[flower] for ours, flower in missing.items()}})


def with_flower_metric_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """Aggregated metrics with Flower's template name added beside each fedsynth name they carry
    (`train-loss` -> `train_loss`, `local-test-accuracy` -> `eval_acc`, `local-test-loss` -> `eval_loss`), so a
    `Result` and fedsynth's metrics.jsonl can be read in either convention."""
    out = dict(values)
    for flower, ours in FLOWER_METRIC_NAMES.items():
        if ours in out:
            out[flower] = out[ours]
    return out


def is_transient(reason: str) -> bool:
    """Whether a dropped reply's reason may pass in a later round (a node error or a timeout), not a contract break."""
    return reason.startswith("error:") or reason == "timeout"


BUILDER = "fedsynth.client.train_reply(msg, model, result, num_examples=n)"


def reply_contract_text(method: str, records: Mapping[str, str] | None = None,
                        metrics: Mapping[str, str] | None = None) -> str:
    """What a good train reply of a centralized strategy carries, and the `fedsynth.client` call that builds it.

    `method` is the strategy's codec method (none, qsgd, topk); `records` the algorithm's extra reply records (name ->
    what it holds and which call adds it); `metrics` its extra reply metrics (name -> meaning).
    """
    loss = '"train-loss" (or Flower\'s "train_loss"): float'
    if method == "none":
        model = ('"arrays": ArrayRecord(the local model, the same names, shapes and dtypes as the global one)')
    else:
        model = (f'"compressed-update": the {method} codec\'s payload of the trainable parameters\' update '
                 'w_i - w (the codec the strategy sent in the config), "model-buffers": the model\'s buffers '
                 '(BatchNorm\'s running statistics and num_batches_tracked) as they are, and no "arrays"')
    text = f'reply RecordDict({{{model}, "metrics": MetricRecord({{"num-examples": int > 0, {loss}'
    text += "".join(f', "{name}": {meaning}' for name, meaning in (metrics or {}).items()) + "})"
    text += "".join(f', "{name}": {what}' for name, what in (records or {}).items()) + "})"
    return f"{text}; {BUILDER} builds exactly this from the message and the trained model"


def contract_violation_error(strategy_name: str, failures: Sequence[Mapping[str, Any]], contract: str,
                             restored: str | None = None, model_note: str = "") -> str | None:
    """The message that ends a first round in which every reply broke the contract, or None.

    After a resume (`restored` names the checkpoint or state the run continued from) the message names that
    state, not the ClientApp, and `model_note` says what is odd about the model it holds (its largest weight).

    None when any reply was usable, when there were none, or when some failure may be transient
    (an error reply, a timeout): those are the business of `min_nodes` and `max_failed_rounds`.
    """
    if not failures or any(is_transient(str(f["reason"])) for f in failures):
        return None
    reasons = sorted({str(f["reason"]) for f in failures})
    if restored is not None:  # these nodes' replies were usable before the state was saved: the state is the suspect
        return (f"{strategy_name}: every reply of the first round after resuming from {restored} was dropped: "
                f"{'; '.join(reasons[:3])}. The nodes' replies were usable before that state was saved, so it is the "
                f"likely fault{model_note}: resume from an earlier checkpoint, or start the run over.")
    return (f"{strategy_name}: every reply of the first round broke the reply contract, so no later round can "
            f"succeed: {'; '.join(reasons[:3])}. Change the ClientApp's reply: {contract} "
            "(docs/library.md, 'The reply contract').")


def largest_weight_note(sent: Sequence[Message]) -> str:
    """", whose largest weight is |w| = ... in 'name'" for the model the first of `sent` carried ("" if none)."""
    record = sent[0].content.array_records.get("arrays") if sent else None
    if record is None:
        return ""
    largest, where = 0.0, ""
    for name, array in record.items():
        values = np.abs(array.numpy().astype(np.float64, copy=False))
        top = float(np.nanmax(values)) if values.size else 0.0
        if top > largest or not where:
            largest, where = top, name
    return f" (its model's largest weight is |w| = {largest:.3g}, in '{where}')" if where else ""
