"""Why FedSynSAM's matching loss barely falls under 4-bit qsgd: trajectories, distillation, noise floor, diagnostic.

    .venv/bin/python benchmarks/fedsynsam_distillation.py trajectory CODEC      # R = 30 FedSAM rounds -> WORK/traj-CODEC.npz
    .venv/bin/python benchmarks/fedsynsam_distillation.py distill CODEC [JSON]  # distil from it (JSON: SynSAMSettings fields)
    .venv/bin/python benchmarks/fedsynsam_distillation.py oracle CODEC          # real balanced data in place of D_syn, alpha scan
    .venv/bin/python benchmarks/fedsynsam_distillation.py floor CODEC           # clean vs compressed global step at w^r
    .venv/bin/python benchmarks/fedsynsam_distillation.py diagnostic ROUNDS     # fedsynsam run with perturbation-diagnostic
    .venv/bin/python benchmarks/fedsynsam_distillation.py codec-check CODEC[,CODEC...] --seeds 0,1 [--rounds 33]
        # FedSynSAM in the codecs study's setting (lr 0.1): the distillation's end/start matching loss per codec

CODEC is `qsgd4` (per tensor, 7 levels), `qsgd17-model` (the paper's 4-bit eq. 3: one norm, 17 levels),
`qsgd17-bucket512` (17 levels, one norm per bucket of 512), `qsgd257-model` (the paper's 8-bit),
`qsgd257-bucket512`, `topk0.1` or `none`. The setup is the `fedsynsam` preset's
cpu size (Fashion-MNIST, mlp, Path(1), 10 clients in full participation,
K = 10 steps of batch 128, lr 0.05, rho 0.05, R = 30), run in process
(fedsynth/inprocess.py). WORK is --work (default /tmp/fedsynsam-distillation).
Results: benchmarks/results/fedsynsam-distillation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from common.run.config import RunConfig  # noqa: E402
from common.data.datasets import dataset_info  # noqa: E402
from common.run.task import make_model  # noqa: E402
from common.algorithms.synsam_settings import SynSAMSettings  # noqa: E402
from server_app.distillation import distill  # noqa: E402
from server_app.app import run_strategy
from server_app.registry import train_records_of  # noqa: E402

CODECS = {"qsgd4": {"compression": "qsgd", "bits": 4}, "topk0.1": {"compression": "topk", "topk-ratio": 0.1},
          "none": {"compression": "none"},
          "qsgd17-model": {"compression": "qsgd", "levels": 17, "qsgd-scope": "model"},
          "qsgd17-bucket512": {"compression": "qsgd", "levels": 17, "qsgd-scope": "bucket", "qsgd-bucket": 512},
          "qsgd257-model": {"compression": "qsgd", "levels": 257, "qsgd-scope": "model"},
          "qsgd257-bucket512": {"compression": "qsgd", "levels": 257, "qsgd-scope": "bucket", "qsgd-bucket": 512}}
# studies/fedsynsam-cpu-codecs.toml's base: the reduced study's tuned lr 0.1 and rho 0.05
CODEC_STUDY = {"algorithm": "fedsynsam", "model": "mlp", "dataset": "fashion-mnist", "partition": "pathological",
               "classes-per-client": 1, "fraction-train": 1.0, "local-steps": 10, "batch-size": 128, "lr": 0.1, "sam-rho": 0.05,
               "trajectory-rounds": 30, "synthetic-ipc": 20, "distill-iterations": 200, "synsam-beta": 0.9,
               "central-eval": False, "checkpoint-every": 0, "save-model": False}
PRESET = {"algorithm": "fedsynsam", "model": "mlp", "dataset": "fashion-mnist", "partition": "pathological",
          "classes-per-client": 1, "local-steps": 10, "batch-size": 128, "lr": 0.05, "sam-rho": 0.05, "seed": 0,
          "trajectory-rounds": 30, "synthetic-ipc": 20, "central-eval": False}


def run_inprocess(raw: dict, num_nodes: int):
    """The ServerApp's main on an in-process grid; returns the strategy (trajectory, D_syn, report)."""
    from common.run.config import parse_run_config
    from fedsynth.inprocess import InProcessGrid
    from common.run.results import RunResults
    from server_app.handshake import handshake
    from server_app.registry import SERVER_STRATEGIES, build_strategy

    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    grid = InProcessGrid(num_nodes, raw)
    strategy = build_strategy(cfg, handshake(grid, cfg))
    with RunResults(cfg) as results:
        run_strategy(grid, cfg, strategy, results)
    return strategy


def load_trajectory(work: Path, codec: str) -> list[dict[str, np.ndarray]]:
    z = np.load(work / f"traj-{codec}.npz")
    count = 1 + max(int(k.split("/")[0]) for k in z.files)
    return [{k.split("/", 1)[1]: z[k] for k in z.files if k.split("/")[0] == str(i)} for i in range(count)]


def cmd_trajectory(work: Path, codec: str) -> None:
    raw = {**PRESET, **CODECS[codec], "num-server-rounds": 30, "distill-iterations": 0,
           "results-dir": str(work / "results"), "run-name": f"traj-{codec}", "cache-dir": str(work / "cache")}
    strategy = run_inprocess(raw, 10)
    np.savez(work / f"traj-{codec}.npz",
             **{f"{i}/{k}": v for i, w in enumerate(strategy.trajectory) for k, v in w.items()})
    flat = [np.concatenate([w[k].ravel() for k in sorted(w)]).astype(np.float64) for w in strategy.trajectory]
    steps = [b - a for a, b in zip(flat, flat[1:])]
    cos = [u @ v / np.linalg.norm(u) / np.linalg.norm(v) for u, v in zip(steps, steps[1:])]
    print(f"{codec}: {len(flat)} global models; mean |global step| {np.mean([np.linalg.norm(u) for u in steps]):.3f}, "
          f"mean cosine of consecutive steps {np.mean(cos):.3f}")


def cmd_distill(work: Path, codec: str, changes: dict) -> None:
    cfg = RunConfig(model="mlp")
    info = dataset_info(cfg.dataset)
    settings = dataclasses.replace(SynSAMSettings.of(cfg), **changes)
    start = time.monotonic()
    result = distill(make_model(cfg), load_trajectory(work, codec), info.num_classes, info.shape, settings,
                     torch.device("cpu"), seed=cfg.seed)
    print(f"{codec} {changes}: matching loss {result.start_loss:.4f} -> {result.end_loss:.4f} "
          f"(end/start {result.end_loss / result.start_loss:.2f}), alpha {result.alpha:.5f}, "
          f"{time.monotonic() - start:.1f} s")


def cmd_oracle(work: Path, codec: str) -> None:
    """Real data (200 per class) in place of D_syn: the loss that the true data would reach, per alpha."""
    from common.data.datasets import load_dataset
    from common.metrics.evaluation import as_tensors
    from server_app.distillation import matching_loss, segment_starts, split_weights, unroll

    model = make_model(RunConfig(model="mlp"))
    data = load_dataset("fashion-mnist", "")
    rng = np.random.default_rng(0)
    index = np.concatenate([rng.choice(np.flatnonzero(data.y_train == c), 200, replace=False) for c in range(10)])
    x, y = as_tensors(data.x_train[index], data.y_train[index], "fashion-mnist", torch.device("cpu"))
    tensors = [split_weights(model, w, torch.device("cpu")) for w in load_trajectory(work, codec)]
    for alpha in (0.01, 0.03, 0.1, 0.3):
        losses = []
        for r in segment_starts(len(tensors), 3):
            (start, buffers), (target, _) = tensors[r], tensors[r + 3]
            w_hat = unroll(model, start, buffers, x, y, torch.tensor(alpha), 3, create_graph=False)
            losses.append(float(matching_loss({k: v.detach() for k, v in w_hat.items()}, start, target)))
        print(f"{codec}: real data, alpha {alpha}: mean matching loss {np.mean(losses):.4f}")


def cmd_floor(work: Path, codec: str) -> None:
    """At w^r: the clients' clean mean update against the compressed one the server applied."""
    from flwr.app import RecordDict

    from client_app.training import LocalJob
    from client_app.updates import fedsam_update
    from common.uplink.payloads import decode_update, encode_update
    from common.algorithms.codec_settings import CodecSettings
    from common.metrics.evaluation import as_tensors
    from common.data.partition import PartitionSpec, load_client_data
    from common.records import load_weights, model_weights

    trajectory = load_trajectory(work, codec)
    cfg = RunConfig(model="mlp", partition="pathological", classes_per_client=1, local_steps=10, batch_size=128,
                    lr=0.05, sam_rho=0.05)
    spec = PartitionSpec(dataset=cfg.dataset, partition=cfg.partition, num_partitions=10, seed=0, alpha=cfg.alpha,
                         classes_per_client=1, local_test_fraction=cfg.local_test_fraction)
    data = [load_client_data(spec, p, "", str(work / "cache")) for p in range(10)]
    uplink = CodecSettings(compression="qsgd", bits=4) if codec == "qsgd4" else (
        CodecSettings(compression="topk", topk_ratio=0.1) if codec == "topk0.1" else CodecSettings(compression="none"))
    rng = np.random.default_rng(0)

    def flat(w):
        return np.concatenate([np.asarray(w[k], np.float64).ravel() for k in sorted(w)])

    for r in (0, 10, 20, 29):
        deltas = []
        for p in range(10):
            model = make_model(cfg)
            load_weights(model, trajectory[r])
            x, y = as_tensors(data[p].x_train, data[p].y_train, cfg.dataset, torch.device("cpu"))
            fedsam_update(LocalJob(cfg=cfg, server_round=r + 1, partition_id=p, model=model, x=x, y=y,
                                   device=torch.device("cpu"), incoming=train_records_of(cfg, r + 1),
                                   state=RecordDict()))
            w = model_weights(model)
            deltas.append({k: (w[k] - trajectory[r][k]).astype(np.float32) for k in w})
        clean = np.mean([flat(d) for d in deltas], axis=0)
        shapes = {k: v.shape for k, v in deltas[0].items()}
        sent = np.mean([flat(decode_update(encode_update(d, uplink, rng), shapes, uplink)) for d in deltas],
                       axis=0)
        error = sent - clean
        print(f"{codec} r={r}: |clean mean update|^2 {clean @ clean:.4f}, |compression error|^2 {error @ error:.4f}, "
              f"clean share of the step's energy {clean @ clean / (sent @ sent):.4f}")


def cmd_diagnostic(work: Path, rounds: int) -> None:
    raw = {**PRESET, **CODECS["qsgd4"], "num-server-rounds": rounds, "distill-iterations": 200,
           "perturbation-diagnostic": True, "results-dir": str(work / "results"), "run-name": "diagnostic-qsgd4",
           "cache-dir": str(work / "cache")}
    strategy = run_inprocess(raw, 10)
    print("distillation:", strategy.distill_report)
    rows = [json.loads(line) for line in (work / "results" / "diagnostic-qsgd4" / "metrics.jsonl").open()]
    after = [row for row in rows if row["round"] > raw["trajectory-rounds"]]
    for key in ("cos-fedsam", "cos-fedlesam", "cos-synthetic", "cos-fedsynsam"):
        print(f"{key}: mean over rounds {after[0]['round']}-{after[-1]['round']}: "
              f"{np.mean([row[key] for row in after]):.4f}; per round "
              + " ".join(f"{row[key]:.3f}" for row in after))


def cmd_codec_check(work: Path, codecs: list[str], seeds: list[int], rounds: int, matching_loss: str) -> None:
    """FedSynSAM runs of `rounds` rounds (R = 30): the distillation's start and end matching loss per codec and seed."""
    suffix = "" if matching_loss == "normalized" else f"-{matching_loss}"
    for codec in codecs:
        for seed in seeds:
            wall = time.monotonic()
            raw = {**CODEC_STUDY, **CODECS[codec], "seed": seed, "num-server-rounds": rounds,
                   "matching-loss": matching_loss, "results-dir": str(work / "results"),
                   "run-name": f"codec-check-{codec}{suffix}-s{seed}", "cache-dir": str(work / "cache")}
            report = run_inprocess(raw, 10).distill_report
            print(json.dumps({"codec": codec, "matching-loss": matching_loss, "seed": seed,
                              "start": report["distill-loss-start"],
                              "end": report["distill-loss-end"],
                              "end/start": report["distill-loss-end"] / report["distill-loss-start"],
                              "alpha": report["distill-alpha"], "seconds": round(time.monotonic() - wall, 1)}),
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("trajectory", "distill", "oracle", "floor", "diagnostic", "codec-check"))
    parser.add_argument("arg")
    parser.add_argument("changes", nargs="?", default="{}")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fedsynsam-distillation"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", default="0", help="codec-check: comma-separated seeds")
    parser.add_argument("--rounds", type=int, default=31, help="codec-check: rounds of each run (R = 30)")
    parser.add_argument("--matching-loss", default="normalized", help="codec-check: normalized or paper (eq. 9)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.command == "trajectory":
        cmd_trajectory(args.work, args.arg)
    elif args.command == "distill":
        cmd_distill(args.work, args.arg, json.loads(args.changes))
    elif args.command == "oracle":
        cmd_oracle(args.work, args.arg)
    elif args.command == "floor":
        cmd_floor(args.work, args.arg)
    elif args.command == "codec-check":
        cmd_codec_check(args.work, args.arg.split(","), [int(x) for x in args.seeds.split(",")], args.rounds,
                        args.matching_loss)
    else:
        cmd_diagnostic(args.work, int(args.arg))


if __name__ == "__main__":
    main()
