"""fedsynth's results folder, checkpoints and progress lines around Flower's `Strategy.start()`.

fedsynth's ServerApp runs every algorithm through the strategy's `start()`, the
same call a Flower developer makes. What a fedsynth run adds is kept out of
the strategies and attached through `start()`'s own extension point, its
`evaluate_fn`, which Flower calls before the first round and after every round
with the round's global model: `RunRecorder` is that function. Each call it

- evaluates the model on the server's test set (`eval-every`), and the
  diffusion metrics of a DDPM;
- writes the round's record to the results folder: the entry of the
  strategy's round log (server_app/strategies/round_log.py: nodes sampled and
  answered, failures with reasons, bytes each way, aggregated metrics) plus the
  evaluation and the server and round times, and the log's phases (FedDDPM's
  warm-up);
- writes the checkpoint every `checkpoint-every` rounds and at the end;
- logs one progress line.

Before `start()`, `initial_arrays` restores a resumed run (model, strategy state,
RNG, metrics) and tells the strategy which rounds are done, so the resumed
`start()` skips them. After it, `finish` has every node evaluate the final
model once (`start()` evaluates per round; fedsynth's clients already evaluate
the model they receive inside each train reply, so only the final model needs
an evaluate round trip) and writes summary.json and the plots.

What it reads of the strategy: its round log (`strategy.round_log`: each round's
entry, the phases, the times), its node table (`strategy.node_table`: the nodes
a checkpoint names, whether a resume may differ by whole sites, the partition of
a node that went away), and its state through `state_dict`/`load_state_dict`.
Three hooks of the strategy remain, each for what only the algorithm knows:
`check_restored` (can restored state continue with this model), `run_summary`
(what it adds to summary.json) and `evaluate_on_every_node` (the final
evaluation, on every node of its table).

What `start()` cannot express is here, with its reason: an interrupted run
(SIGINT/SIGTERM) checkpoints its last finished round (`on_interrupt`), and a
run ended by `TooManyFailedRounds` still records its last round
(`on_failed_round`), because both leave `start()` by an exception.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from common.protocol import WARMUP_PHASE
from common.algorithms.plugins import algorithm_of
from common.run.config import RunConfig
from common.models.diffusion import is_diffusion
from common.run.interrupt import raise_if_stopped
from common.records import Weights, from_record, model_weights, to_record
from common.run.results import RunResults, run_accuracy
from common.run.task import make_model
from server_app.decentralized_report import decentralized_summary, plot_decentralized
from server_app.checkpoint import Checkpoint, CheckpointError, load_checkpoint, node_table, save_checkpoint
from server_app.diffusion_eval import DiffusionEvaluator
from server_app.evaluation import central_evaluator
from server_app.outcome import STATUS_OK, conclude
from server_app.strategies.base import RoundStrategy


class RunRecorder:
    """The `evaluate_fn` of a fedsynth run: evaluation, round records, checkpoints and progress lines."""

    def __init__(self, cfg: RunConfig, strategy: RoundStrategy, results: RunResults, grid: Grid) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.results = results
        self.grid = grid
        self.evaluator = central_evaluator(cfg)
        self.diffusion: DiffusionEvaluator | None = None  # FID and sample grids
        if is_diffusion(cfg):  # FID's reference without server data: the nodes' feature sums, asked once
            reference = getattr(strategy, "feature_reference", None)
            self.diffusion = DiffusionEvaluator(cfg, results, reference.asker(grid) if reference is not None else None)
        self.weights: Weights = {}
        self.finished = 0          # last round recorded
        self.phases_recorded = 0   # phases of the round log written
        self.last_checkpoint = 0   # last round checkpointed
        self.started = time.monotonic()

    # ----- before start() -------------------------------------------------------------
    def initial_arrays(self) -> ArrayRecord:
        """The model `start()` begins from: the seeded initial model, or the checkpoint's of a resumed run."""
        weights = model_weights(make_model(self.cfg, seeded=True))
        if self.results.resuming:
            weights, done = self._resume(weights)
            self.finished = self.last_checkpoint = done
        self.weights = weights
        self.started = time.monotonic()
        return to_record(weights)

    def _resume(self, template: Weights) -> tuple[Weights, int]:
        """Restore model, strategy state, RNG and metrics from the run's checkpoint; returns (weights, its round)."""
        strategy, results, table = self.strategy, self.results, self.strategy.node_table
        late_joins = table.late_join_refusal() is None  # then a resume may differ by whole sites, as the run did
        ckpt = load_checkpoint(results.path, self.cfg, template, node_table(table.nodes), late_joins)
        self._log_node_changes(ckpt.nodes, node_table(table.nodes))
        try:  # the strategy's own protocol: its server state and the rounds it finished (start() skips them)
            strategy.load_state_dict({"arrays": ckpt.state_arrays, "meta": ckpt.state_meta,
                                      "completed-rounds": ckpt.server_round,
                                      "restored-from": f"the checkpoint in {results.path}"})
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # nothing is written yet: refuse cleanly
            raise CheckpointError(f"checkpoint {results.path} holds a strategy state {type(strategy).__name__} cannot "
                                  f"use ({type(err).__name__}: {err}); delete it to start over") from None
        problem = strategy.check_restored(template)
        if problem:
            raise CheckpointError(problem)
        results.restore_rounds(ckpt.metrics)
        if ckpt.torch_rng is not None:
            torch.set_rng_state(torch.from_numpy(ckpt.torch_rng.copy()))
        log(INFO, "resumed from the checkpoint of round %d in %s", ckpt.server_round, results.path)
        return ckpt.weights, ckpt.server_round

    @staticmethod
    def _log_node_changes(saved: list[list[int]] | None, now: list[list[int]]) -> None:
        """One line for partitions of the checkpoint not connected now, and one for those it lacks."""
        if saved is None:
            return
        before, current = {p for p, _ in saved}, {p for p, _ in now}
        if before - current:
            log(INFO, "resumed without partition(s) %s of the checkpoint: each takes part again once it connects "
                "(as a site that joins late)", sorted(before - current))
        if current - before:
            log(INFO, "partition(s) %s joined after the checkpoint was written: they take part as sites that "
                "joined late", sorted(current - before))

    # ----- start()'s evaluate_fn --------------------------------------------------------
    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Record round `server_round` (0: the initial model); returns the central metrics, if any."""
        if server_round == 0:
            return self._record_initial(arrays)
        self._record_phases()
        entry = self.strategy.round_log.entry(server_round)
        if entry is None:  # a round that sent nothing: restored or stopped
            return None
        self.weights = from_record(arrays)
        record: dict[str, Any] = {**entry.as_record(), **self._node_returns()}
        is_last = server_round == self.cfg.num_server_rounds
        central: dict[str, float] = {}
        if self.evaluator is not None and (is_last or (self.cfg.eval_every and server_round % self.cfg.eval_every == 0)):
            central["central-loss"], central["central-accuracy"] = self.evaluator.evaluate(self.weights)
            record.update(central)
        stopping = entry.stops_run  # FedDDPM+ ends after its one-shot correction
        if self.diffusion is not None:
            record.update(self.diffusion.after_round(server_round, self.weights, is_last or stopping))
        now = time.monotonic()
        record["server-time"] = now - (entry.started_at if entry.collected_at is None else entry.collected_at)
        record["round-time"] = now - entry.started_at
        self.results.log_round(record)
        self.finished = server_round
        if self.cfg.checkpoint_every and (server_round % self.cfg.checkpoint_every == 0 or is_last or stopping):
            self.checkpoint(server_round)
        log(INFO, "%s", progress_line(record, self.cfg.num_server_rounds))
        if stopping:
            log(INFO, "round %d: %s stopped the run", server_round, type(self.strategy).__name__)
        raise_if_stopped()  # SIGINT/SIGTERM: stop between rounds; on_interrupt keeps this one (common/run/interrupt.py)
        return MetricRecord(central) if central else None

    def _record_initial(self, arrays: ArrayRecord) -> MetricRecord | None:
        if self.results.resuming or self.evaluator is None:
            return None
        loss, accuracy = self.evaluator.evaluate(from_record(arrays))
        self.results.log_round({"round": 0, "central-loss": loss, "central-accuracy": accuracy})
        log(INFO, "[round 0/%d] acc %.4f loss %.4f", self.cfg.num_server_rounds, accuracy, loss)
        return MetricRecord({"central-loss": loss, "central-accuracy": accuracy})

    def _record_phases(self) -> None:
        """Write the records of the steps that are not rounds (FedDDPM's warm-up) logged since the last call."""
        phases = self.strategy.round_log.phases
        for phase in phases[self.phases_recorded:]:
            record = phase.as_record()
            if phase.phase == WARMUP_PHASE and self.diffusion is not None:  # the auxiliary set: a grid, its FID
                self.diffusion.after_warmup(phase.product, record)
            self.results.log_round(record)
        self.phases_recorded = len(phases)

    def checkpoint(self, server_round: int) -> None:
        """Write the checkpoint of `server_round` (the model of the last recorded round)."""
        strategy = self.strategy
        state = strategy.state_dict()  # the strategy's server state, through its one protocol
        save_checkpoint(self.results.path, self.cfg, Checkpoint(
            server_round, self.weights, state["arrays"], state["meta"], self.results.rounds,
            nodes=node_table(strategy.node_table.nodes),
        ))
        self.last_checkpoint = server_round

    # ----- what leaves start() by an exception -------------------------------------------
    def on_interrupt(self) -> None:
        """Keep what the finished rounds computed: a checkpoint of the last one, unless it has one."""
        if self.cfg.checkpoint_every and self.finished > self.last_checkpoint:
            self.checkpoint(self.finished)
            log(INFO, "interrupted: checkpoint of round %d written", self.finished)

    def on_failed_round(self) -> None:
        """Record the round that ended the run (too few nodes too many times)."""
        self._record_phases()
        entry = self.strategy.round_log.latest
        if entry is not None:
            self.results.log_round({**entry.as_record(), **self._node_returns()})

    def _node_returns(self) -> dict[str, Any]:
        """`node-returns`: the round's waits for nodes the SuperLink reported unavailable (server_app/node_return.py)."""
        returns = getattr(self.grid, "returns", None)
        events = returns.take_events() if returns is not None else []
        for event in events:
            node = self.strategy.node_table.of(event["node"])
            event["partition"] = None if node is None else node.partition_id
        return {"node-returns": events} if events else {}

    # ----- after start() --------------------------------------------------------------
    def finish(self, grid: Grid, result: Result) -> dict[str, Any]:
        """The final evaluation on every node, summary.json and the plots; returns the summary."""
        self._record_phases()
        cfg, results, strategy = self.cfg, self.results, self.strategy
        weights = from_record(result.arrays) if len(result.arrays) else self.weights
        summary: dict[str, Any] = {
            "algorithm": cfg.algorithm,
            "dataset": cfg.dataset,
            "partition": cfg.partition,
            "rounds": cfg.num_server_rounds,
            "num-nodes": len(strategy.node_table.nodes),
            "wall-time": time.monotonic() - self.started,
        }
        for key in ("uplink-bytes", "uplink-float32-bytes", "downlink-bytes"):
            if key != "uplink-float32-bytes" or any(key in r for r in results.rounds):
                summary[key] = sum(r.get(key, 0) for r in results.rounds)
        central = [r for r in results.rounds if "central-accuracy" in r]
        if central:
            summary["final-central-accuracy"] = central[-1]["central-accuracy"]
            summary["final-central-loss"] = central[-1]["central-loss"]
            summary["best-central-accuracy"] = max(r["central-accuracy"] for r in central)
        summary.update(strategy.run_summary(results.rounds))
        if algorithm_of(cfg.algorithm).decentralized:
            summary.update(decentralized_summary(cfg, results.rounds))
        if self.diffusion is not None:
            summary.update(self.diffusion.summary())
        conclude(summary, results, weights)
        # a DDPM has no local test accuracy: the nodes evaluate classifiers only
        if self.diffusion is None:
            final = strategy.evaluate_on_every_node(grid, to_record(weights), cfg.num_server_rounds, cfg.round_timeout,
                                                    cfg.reply_poll_interval)
            if final is not None:
                summary.update({f"final-{key}": value for key, value in dict(final).items()})
        summary.update(run_accuracy(summary))
        if cfg.save_model:
            results.write_model(weights)
        results.write_summary(summary)
        results.write_plots()
        if algorithm_of(cfg.algorithm).decentralized:
            plot_decentralized(results.rounds, results.path)
        log(INFO if summary["status"] == STATUS_OK else WARNING, "results written to %s%s", results.path,
            f" ({summary['status']}: {summary['status-reason']})" if summary["status-reason"] else "")
        return summary


def progress_line(record: dict[str, Any], num_rounds: int) -> str:
    """One line per round: accuracy, loss, nodes, bytes and time (a decentralized run: x-bar and consensus)."""
    parts = [f"[round {record['round']}/{num_rounds}]"]
    decentralized = "consensus-distance" in record
    if "central-accuracy" in record:
        parts.append(f"x-bar acc {record['central-accuracy']:.4f}" if decentralized
                     else f"acc {record['central-accuracy']:.4f} loss {record['central-loss']:.4f}")
    elif "local-test-accuracy" in record and not decentralized:  # no test set on the server: the nodes' own splits
        parts.append(f"local-test acc {record['local-test-accuracy']:.4f}")
    if "node-accuracy-mean" in record:
        parts.append(f"nodes acc {record['node-accuracy-mean']:.4f} "
                     f"[{record['node-accuracy-min']:.3f}, {record['node-accuracy-max']:.3f}]")
    if decentralized:
        parts.append(f"consensus {record['consensus-distance']:.4g}")
    elif "train-loss" in record:
        parts.append(f"train-loss {record['train-loss']:.4f}")
    parts.append(f"nodes {record['answered']}/{record['sampled']}")
    parts.append(f"up {record['uplink-bytes'] / 1e6:.2f} MB down {record['downlink-bytes'] / 1e6:.2f} MB")
    parts.append(f"{record['round-time']:.2f}s")
    return " | ".join(parts)
