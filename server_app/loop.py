"""The server's round loop for centralized algorithms.

Per round: the strategy configures messages for the sampled nodes; replies that
errored, timed out or fail the strategy's checks are recorded as failures and
left out; if at least `min-nodes` answered, the strategy aggregates. Then the
global model is evaluated centrally and the round's metrics (nodes, losses,
accuracy, bytes each way, wall times) are written. After the last round every
node evaluates the final model on its local test split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from common.config import RunConfig
from common.diffusion import is_diffusion
from common.interrupt import RunInterrupted, raise_if_stopped
from common.records import Weights, from_record, message_array_bytes, model_weights, to_record
from common.results import RunResults, run_accuracy
from common.task import make_model
from common.uplink import float32_equivalent_bytes
from server_app.checkpoint import Checkpoint, CheckpointError, load_checkpoint, node_table, save_checkpoint
from server_app.diffusion_eval import DiffusionEvaluator
from server_app.evaluation import central_evaluator
from server_app.messaging import match_replies, send_and_receive
from server_app.outcome import STATUS_OK, conclude
from server_app.reply_checks import check_train_metrics
from server_app.strategies.fedavg import FedAvgStrategy, NodeInfo


class TooManyFailedRounds(RuntimeError):
    """Fewer than min-nodes answered for max-failed-rounds rounds in a row."""


@dataclass
class RoundOutcome:
    """The replies of one round, sorted into usable ones and failures."""

    good: list[Message] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    uplink_bytes: int = 0
    uplink_float32_bytes: int = 0  # what the same replies would weigh uncompressed (SPEC 3.5)


def collect_replies(strategy: FedAvgStrategy, sent: list[Message], replies: list[Message]) -> RoundOutcome:
    """Split replies into checked-good ones and recorded failures (error, invalid, timeout)."""
    node_of = {n.node_id: n for n in strategy.nodes}
    partition_of_node = {n.node_id: n.partition_id for n in strategy.nodes}
    outcome = RoundOutcome()
    model_record = sent[0].content.array_records.get("arrays") if sent else None
    model_bytes = model_record.count_bytes() if model_record is not None else 0  # a compressed reply replaces it
    pairs, unanswered = match_replies(sent, replies)
    for message, reply in pairs:
        node_id = message.metadata.dst_node_id  # not the reply's source: the SuperLink answers for lost nodes
        outcome.uplink_bytes += message_array_bytes(reply)
        outcome.uplink_float32_bytes += float32_equivalent_bytes(reply, model_bytes)
        reason = f"error: {reply.error.reason}" if reply.has_error() else _check_train_reply(strategy, reply, node_of.get(node_id))
        if reason is None:
            outcome.good.append(reply)
        else:
            outcome.failures.append({"node": node_id, "partition": partition_of_node.get(node_id), "reason": reason})
    for message in unanswered:
        node_id = message.metadata.dst_node_id
        outcome.failures.append({"node": node_id, "partition": partition_of_node.get(node_id), "reason": "timeout"})
    for failure in outcome.failures:
        log(WARNING, "dropped reply of node %s (partition %s): %s", failure["node"], failure["partition"], failure["reason"])
    return outcome


def _check_train_reply(strategy: FedAvgStrategy, reply: Message, node: NodeInfo | None) -> str | None:
    """Every metric field (against the node's handshake), then the strategy's checks of the arrays."""
    if node is None:
        return "reply from a node that did not complete the handshake"
    reason = check_train_metrics(reply.content.metric_records.get("metrics"), node.partition_id, node.num_train_examples,
                                 max_test_examples=node.num_test_examples)
    if reason is not None:
        return reason
    try:
        return strategy.check_reply(reply)
    except Exception as err:  # noqa: BLE001 - a reply must never crash the server: any fault drops it
        return f"malformed reply ({type(err).__name__}: {err})"


def resume_from_checkpoint(cfg: RunConfig, strategy: FedAvgStrategy, results: RunResults, template: Weights) -> tuple[Weights, int]:
    """Restore model, strategy state, RNG and metrics from the run's checkpoint; returns (weights, next round)."""
    ckpt = load_checkpoint(results.path, cfg, template, node_table(strategy.nodes))
    try:
        strategy.load_checkpoint_arrays(ckpt.state_arrays)
        strategy.load_state_meta(ckpt.state_meta)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # nothing is written yet: refuse cleanly
        raise CheckpointError(f"checkpoint {results.path} holds a strategy state {type(strategy).__name__} cannot "
                              f"use ({type(err).__name__}: {err}); delete it to start over") from None
    strategy.on_resume()
    results.restore_rounds(ckpt.metrics)
    if ckpt.torch_rng is not None:
        torch.set_rng_state(torch.from_numpy(ckpt.torch_rng.copy()))
    log(INFO, "resumed from the checkpoint of round %d in %s", ckpt.server_round, results.path)
    return ckpt.weights, ckpt.server_round + 1


def _progress_line(record: dict[str, Any], num_rounds: int) -> str:
    parts = [f"[round {record['round']}/{num_rounds}]"]
    if "central-accuracy" in record:
        parts.append(f"acc {record['central-accuracy']:.4f} loss {record['central-loss']:.4f}")
    elif "local-test-accuracy" in record:  # no test set on the server: the nodes' own test splits
        parts.append(f"local-test acc {record['local-test-accuracy']:.4f}")
    if "train-loss" in record:
        parts.append(f"train-loss {record['train-loss']:.4f}")
    parts.append(f"nodes {record['answered']}/{record['sampled']}")
    parts.append(f"up {record['uplink-bytes'] / 1e6:.2f} MB down {record['downlink-bytes'] / 1e6:.2f} MB")
    parts.append(f"{record['round-time']:.2f}s")
    return " | ".join(parts)


def run_rounds(grid: Grid, cfg: RunConfig, strategy: FedAvgStrategy, results: RunResults) -> dict[str, Any]:
    """Run all rounds; returns the run summary (also written to summary.json)."""
    strategy.summary()
    weights: Weights = model_weights(make_model(cfg, seeded=True))
    evaluator = central_evaluator(cfg)
    diffusion = DiffusionEvaluator(cfg, results, strategy.feature_reference.asker(grid)) if is_diffusion(cfg) else None
    first_round = 1
    if results.resuming:
        weights, first_round = resume_from_checkpoint(cfg, strategy, results, weights)
        if strategy.stop_requested():  # it had finished (FedDDPM+): a resume must not train on
            log(INFO, "the checkpointed run had already stopped at round %d; nothing left to run", first_round - 1)
            first_round = cfg.num_server_rounds + 1
    elif evaluator is not None:
        loss, accuracy = evaluator.evaluate(weights)
        results.log_round({"round": 0, "central-loss": loss, "central-accuracy": accuracy})
        log(INFO, "[round 0/%d] acc %.4f loss %.4f", cfg.num_server_rounds, accuracy, loss)
    failed_in_a_row = 0
    start = time.monotonic()
    last_checkpoint = first_round - 1 if results.resuming else 0
    finished = first_round - 1
    try:
        for server_round in range(first_round, cfg.num_server_rounds + 1):
            raise_if_stopped()
            round_start = time.monotonic()
            config = ConfigRecord({"lr": cfg.local_lr(server_round)})
            sent = list(strategy.configure_train(server_round, to_record(weights), config, grid))
            downlink = sum(message_array_bytes(m) for m in sent)
            replies = send_and_receive(grid, sent, cfg.round_timeout, cfg.reply_poll_interval)
            server_start = time.monotonic()
            outcome = collect_replies(strategy, sent, replies)
            record: dict[str, Any] = {
                "round": server_round,
                "sampled": len(sent),
                "answered": len(outcome.good),
                "failed": len(outcome.failures),
                "failures": outcome.failures,
                "uplink-bytes": outcome.uplink_bytes,
                "uplink-float32-bytes": outcome.uplink_float32_bytes,
                "downlink-bytes": downlink,
                "lr": cfg.local_lr(server_round),
            }
            if len(outcome.good) >= cfg.min_nodes:
                failed_in_a_row = 0
                arrays, metrics = strategy.aggregate_train(server_round, outcome.good)
                if arrays is not None:
                    weights = from_record(arrays)
                if metrics is not None:
                    record.update(dict(metrics))
            else:
                failed_in_a_row += 1
                record["skipped"] = True
                log(WARNING, "round %d: %d of %d nodes answered, fewer than min-nodes=%d; model unchanged",
                    server_round, len(outcome.good), len(sent), cfg.min_nodes)
                if failed_in_a_row >= cfg.max_failed_rounds:
                    results.log_round(record)
                    raise TooManyFailedRounds(
                        f"fewer than min-nodes={cfg.min_nodes} nodes answered in {failed_in_a_row} rounds in a row "
                        f"(max-failed-rounds={cfg.max_failed_rounds}); last failures: {outcome.failures[:3]}"
                    )
            is_last = server_round == cfg.num_server_rounds
            if evaluator is not None and (is_last or (cfg.eval_every and server_round % cfg.eval_every == 0)):
                record["central-loss"], record["central-accuracy"] = evaluator.evaluate(weights)
            stopping = strategy.stop_requested()  # FedDDPM+ ends after its one-shot correction
            if diffusion is not None:
                record.update(diffusion.after_round(server_round, weights, is_last or stopping))
            record["server-time"] = time.monotonic() - server_start
            record["round-time"] = time.monotonic() - round_start
            results.log_round(record)
            finished = server_round
            if cfg.checkpoint_every and (server_round % cfg.checkpoint_every == 0 or is_last or stopping):
                save_checkpoint(results.path, cfg, Checkpoint(
                    server_round, weights, strategy.checkpoint_arrays(), strategy.state_meta(), results.rounds,
                    nodes=node_table(strategy.nodes),
                ))
                last_checkpoint = server_round
            log(INFO, "%s", _progress_line(record, cfg.num_server_rounds))
            if stopping:
                log(INFO, "round %d: %s stopped the run", server_round, type(strategy).__name__)
                break
    except RunInterrupted:
        # keep what the finished rounds computed: a checkpoint of the last one (unless it has one), then let
        # RunResults write summary.json with status interrupted and the CLI print the resume command
        if cfg.checkpoint_every and finished > last_checkpoint:
            save_checkpoint(results.path, cfg, Checkpoint(
                finished, weights, strategy.checkpoint_arrays(), strategy.state_meta(), results.rounds,
                nodes=node_table(strategy.nodes),
            ))
            log(INFO, "interrupted: checkpoint of round %d written", finished)
        raise

    summary: dict[str, Any] = {
        "algorithm": cfg.algorithm,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "rounds": cfg.num_server_rounds,
        "num-nodes": len(strategy.nodes),
        "wall-time": time.monotonic() - start,
        "uplink-bytes": sum(r.get("uplink-bytes", 0) for r in results.rounds),
        "uplink-float32-bytes": sum(r.get("uplink-float32-bytes", 0) for r in results.rounds),
        "downlink-bytes": sum(r.get("downlink-bytes", 0) for r in results.rounds),
    }
    last_central = [r for r in results.rounds if "central-accuracy" in r]
    if last_central:
        summary["final-central-accuracy"] = last_central[-1]["central-accuracy"]
        summary["final-central-loss"] = last_central[-1]["central-loss"]
        summary["best-central-accuracy"] = max(r["central-accuracy"] for r in last_central)
    if diffusion is not None:
        summary.update(diffusion.summary())
    conclude(summary, results, weights)
    # a DDPM has no local test accuracy: the nodes evaluate classifiers only
    final_eval = None if diffusion is not None else strategy.aggregate_evaluate(
        cfg.num_server_rounds,
        send_and_receive(
            grid, list(strategy.configure_evaluate(cfg.num_server_rounds, to_record(weights), ConfigRecord({}), grid)),
            cfg.round_timeout, cfg.reply_poll_interval,
        ),
    )
    if final_eval is not None:
        summary.update({f"final-{key}": value for key, value in final_eval.items()})
    summary.update(run_accuracy(summary))
    if cfg.save_model:
        results.write_model(weights)
    results.write_summary(summary)
    results.write_plots()
    log(INFO if summary["status"] == STATUS_OK else WARNING, "results written to %s%s", results.path,
        f" ({summary['status']}: {summary['status-reason']})" if summary["status-reason"] else "")
    return summary
