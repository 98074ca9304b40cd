"""OledFL investigation (issue 6): spectra of the gossip matrices, and a fast sweep of DFedAvg vs OledFL.

    PYTHONPATH=. python -m benchmarks.oledfl_sweep eigen [--nodes 20 --peers 4]
    PYTHONPATH=. python -m benchmarks.oledfl_sweep run --algorithm oledfl-sgd --beta 0.5 --rounds 30 \
        --local-steps 20 --lr 0.1 [--topology ring --nodes 100] [--classes-per-client 2] [--out FILE.json]

`eigen`: for the random topologies (`random`, k-regular, and `random-draws`)
and the static ones, the eigenvalues of W and of Ole's effective gossip matrix
M = (1+beta) W - beta I, the mean-square contraction per round of a
disagreement vector under M (E ||M e||^2 / ||e||^2 over fresh random W,
trace/(n-1) of the expected operator, which is exact by symmetry for random
graphs; the worst mode for a static W; <1: consensus, >1: the nodes drift
apart) and the beta where it reaches 1. Also for
the directed "uniform 1/(k+1)" random matrix (each node averages itself and k
peers it drew), for comparison; and psi and Ole's stable beta per static
topology (formerly the `oledfl` preset's table).

`run`: the decentralized algorithms of client_app/decentralized.py
(dfedavg, dfedavgm, oledfl-sgd) in one process without Flower's messages and
records (a plain loop over the N nodes), for quick sweeps. The numbers are the project's: the split
(common.data.partition, same seed and local test fraction), the seeded x^0, the
batch order (client_app.training.batch_indices), the per-round W
(common.algorithms.topology.mixing_matrix(seed, round)), lr * decay^(t-1), SGD with
weight decay (plain SGD, or momentum with the buffer reset every round),
Ole's restart x_i + beta (x_i - z_i^{t-1}) with z_i^{-1} = x^0, and the
accuracy of x-bar on the dataset's test set. Checked against the in-process
Flower apps at cpu size: the same x-bar accuracy after round 1 (0.1148) and
round 2 of OledFL (0.3175), then float-rounding drift of ~0.02. A research
tool for sweeps; the studies (studies/oledfl-*.toml) run the real Flower apps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def uniform_random(n: int, k: int, seed: int, round_num: int) -> np.ndarray:
    """Each node averages itself and k peers it drew, weights 1/(k+1) (row-stochastic, not symmetric)."""
    rng = np.random.default_rng([seed, round_num, 7])
    w = np.zeros((n, n))
    for i in range(n):
        picks = rng.choice(n - 1, size=k, replace=False)
        w[i, picks + (picks >= i)] = 1.0 / (k + 1)
        w[i, i] = 1.0 / (k + 1)
    return w


def eigen_report(n: int, k: int, betas: list[float], samples: int = 200) -> str:
    """Spectra of W and Ole's gossip factor per topology, and psi with Ole's stable beta for the static ones.

    The static-topology table was the `oledfl` preset's psi table (issue 18 replaced the preset by studies).
    """
    from common.algorithms.mixing_spectrum import ole_beta_bound, ole_gossip_contraction, ole_gossip_growth, spectral_psi
    from common.algorithms.topology import mixing_matrix

    lines = [f"# Spectra, {n} nodes, random k = {k} ({samples} rounds' matrices; 100-node rows: 40)", "",
             "| W | mean degree | lambda_min (mean, min over rounds) | lambda_2 (mean) | mean self-weight | "
             + " | ".join(f"E-contraction beta={b:g}" for b in betas) + " | beta where it reaches 1 | "
             f"measured product growth beta={betas[-1]:g} |",
             "| --- | --- | --- | --- | --- |" + " --- |" * len(betas) + " --- | --- |"]

    def random_ws(kind: str, nodes: int, peers: int, count: int) -> list[np.ndarray]:
        return [mixing_matrix(kind, nodes, peers=peers, seed=0, round_num=t) for t in range(1, count + 1)]

    cases = {
        f"random (k-regular; MH = uniform 1/(k+1)), k={k}": random_ws("random", n, k, samples),
        f"random-draws MH (before issue 18), k={k}": random_ws("random-draws", n, k, samples),
        f"uniform 1/(k+1), directed draws, k={k}": [uniform_random(n, k, 0, t) for t in range(1, samples + 1)],
        "random (k-regular), 100 nodes, k=10 (paper scale)": random_ws("random", 100, 10, 40),
        "random-draws MH, 100 nodes, k=10": random_ws("random-draws", 100, 10, 40),
        "uniform 1/11, directed draws, 100 nodes, k=10": [uniform_random(100, 10, 0, t) for t in range(1, 41)],
    }
    static = ("ring", "grid", "exponential", "full")
    for t in static:
        cases[t] = [mixing_matrix(t, n)]
    for name, ws in cases.items():
        exchangeable = name not in static
        eig = [np.sort(np.linalg.eigvals(w).real) for w in ws]
        lam_min = [e[0] for e in eig]
        lam_2 = [e[-2] for e in eig]
        degree = float(np.mean([((w > 0).sum(axis=1) - 1).mean() for w in ws]))
        selfw = float(np.mean([np.mean(np.diag(w)) for w in ws]))
        contr = [ole_gossip_contraction(ws, b, exchangeable=exchangeable) for b in betas]
        lines.append(f"| {name} | {degree:.1f} | {np.mean(lam_min):.3f}, {np.min(lam_min):.3f} | {np.mean(lam_2):.3f} | "
                     f"{selfw:.3f} | " + " | ".join(f"{c:.3f}" for c in contr) + f" | {critical_beta(ws, exchangeable)} | "
                     f"{ole_gossip_growth(ws if exchangeable else ws * 50, betas[-1]):.3f} |")
    lines += ["", "Ole's gossip M = (1+beta) W - beta I maps an eigenvalue lambda of W to (1+beta) lambda - beta: "
              "|.| < 1 needs beta < (1+lambda)/(1-lambda) for the most negative lambda; and |(1+beta) lambda - beta| < |lambda| "
              "(faster consensus than W) only for lambda > beta/(2+beta). E-contraction is "
              "E||P M e||^2/||e||^2 for disagreement vectors e (P removes the mean): with a fresh random W per "
              "round the same for every e, trace/(n-1) of the averaged operator (issue 35; the top eigenvalue of "
              "a finite average is biased upward); for a static W the worst e. The last column is measured: the "
              "per-round factor of ||P M_T ... M_1 P||_F^2 / (n-1) over the rows' matrices in order (a static W: 50 "
              "rounds): "
              "beta = 0 is plain gossip; > 1 means Ole's restarts alone push the nodes apart. The directed "
              "uniform rows are not symmetric (their lambda columns are real parts).", "",
              f"## psi of the static topologies ({n} nodes)", "",
              "| topology | psi | 1/(1-psi) | lambda_min | largest stable beta (1+lambda_min)/(1-lambda_min) |",
              "| --- | --- | --- | --- | --- |"]
    for t in ("ring", "grid", "exponential", "full"):
        w = mixing_matrix(t, n)
        psi, lam_min = spectral_psi(w), float(np.linalg.eigvalsh(w)[0])
        inverse = "-" if psi >= 1 else f"{1 / (1 - psi):.1f}"
        lines.append(f"| {t} | {psi:.4f} | {inverse} | {lam_min:.4f} | {ole_beta_bound(w):.3f} |")
    return "\n".join(lines)


def critical_beta(ws: list[np.ndarray], exchangeable: bool) -> str:
    """The beta in [0, 1) at which Ole's mean-square gossip factor reaches 1 (bisection), or '>= 1'."""
    from common.algorithms.mixing_spectrum import ole_gossip_contraction

    if ole_gossip_contraction(ws, 0.999, exchangeable=exchangeable) < 1.0:
        return ">= 1"
    low, high = 0.0, 0.999
    for _ in range(25):
        middle = (low + high) / 2
        expands = ole_gossip_contraction(ws, middle, exchangeable=exchangeable) >= 1.0
        low, high = (low, middle) if expands else (middle, high)
    return f"{high:.3f}"


def node_tensors(cfg: Any, n: int) -> tuple[tuple, tuple, Any, Any]:
    """Every node's training split and the official test split as CPU tensors, partitioned as the app does."""
    import torch

    from common.data.datasets import load_dataset
    from common.metrics.evaluation import as_tensors
    from common.data.partition import PartitionSpec, load_client_data

    spec = PartitionSpec(dataset=cfg.dataset, partition=cfg.partition, num_partitions=n, seed=cfg.seed,
                         alpha=cfg.alpha, classes_per_client=cfg.classes_per_client,
                         local_test_fraction=cfg.local_test_fraction)
    device = torch.device("cpu")
    data = [load_client_data(spec, i, cfg.data_dir, cfg.cache_dir) for i in range(n)]
    xs, ys = zip(*(as_tensors(d.x_train, d.y_train, cfg.dataset, device) for d in data))
    test = load_dataset(cfg.dataset, cfg.data_dir)
    xt, yt = as_tensors(test.x_test, test.y_test, cfg.dataset, device)
    return xs, ys, xt, yt


def run(args: argparse.Namespace) -> dict:
    import torch
    from torch.func import functional_call

    from client_app.training import batch_indices
    from common.run.config import parse_run_config
    from common.run.task import make_model
    from common.algorithms.topology import mixing_matrix
    from server_app.registry import SERVER_STRATEGIES

    torch.set_num_threads(args.threads)
    split = ({"partition": "pathological", "classes-per-client": args.classes_per_client} if args.classes_per_client
             else {"partition": "dirichlet", "alpha": args.alpha})
    raw = {"algorithm": "dfedavg", "dataset": "fashion-mnist", "model": "cnn", **split, "local-steps": args.local_steps, "local-epochs": args.local_epochs,
           "batch-size": args.batch_size, "lr": args.lr, "lr-decay": args.lr_decay, "weight-decay": args.wd,
           "seed": args.seed, "data-dir": args.data_dir, "cache-dir": args.cache_dir, "device": "cpu"}
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    n = args.nodes
    xs, ys, xt, yt = node_tensors(cfg, n)

    model = make_model(cfg, seeded=True)
    names = [name for name, _ in model.named_parameters()]
    x0 = {name: p.detach().clone() for name, p in model.named_parameters()}
    z = {name: p.unsqueeze(0).repeat(n, *([1] * p.dim())) for name, p in x0.items()}  # z_i^{-1} = x^0

    beta = args.beta if args.algorithm == "oledfl-sgd" else 0.0
    momentum = args.momentum if args.algorithm == "dfedavgm" else 0.0
    targets = [float(t) for t in args.targets.split(",")]
    curve, consensus, start = [], [], time.monotonic()
    for t in range(1, args.rounds + 1):
        if args.topology == "uniform":
            w = uniform_random(n, args.peers, cfg.seed, t)
        else:
            w = mixing_matrix(args.topology, n, peers=args.peers, seed=cfg.seed, round_num=t)
        wt = torch.tensor(w, dtype=torch.float64)
        params = {}
        for name in names:
            flat = z[name].reshape(n, -1).double()
            mixed = (wt @ flat)
            start_point = mixed + beta * (mixed - flat) if beta else mixed  # Ole: x_i + beta (x_i - z_i^{t-1})
            params[name] = start_point.float().reshape(z[name].shape)
        lr = cfg.lr * cfg.lr_decay ** (t - 1)
        batches = [list(batch_indices(len(ys[i]), cfg, t, i)) for i in range(n)]
        steps = max(len(b) for b in batches)
        out = {k: torch.empty_like(params[k]) for k in names}
        for i in range(n):  # node by node (on CPU a loop of small models beats vmap's grouped convolutions)
            p = [params[k][i].clone().requires_grad_(True) for k in names]
            buf = None
            for idx in batches[i]:
                index = torch.from_numpy(idx)
                loss = torch.nn.functional.cross_entropy(
                    functional_call(model, dict(zip(names, p)), (xs[i][index],)), ys[i][index])
                grads = torch.autograd.grad(loss, p)
                with torch.no_grad():
                    d = [g + cfg.weight_decay * q for g, q in zip(grads, p)]
                    if momentum:
                        buf = d if buf is None else [momentum * m + e for m, e in zip(buf, d)]
                        d = buf
                    for q, e in zip(p, d):
                        q.sub_(lr * e)
            for k, q in zip(names, p):
                out[k][i] = q.detach()
        params = out
        z = {k: v.detach() for k, v in params.items()}
        mean = {k: z[k].mean(0) for k in names}
        cons = float(sum(((z[k] - mean[k]) ** 2).sum() for k in names) / n)
        with torch.no_grad():
            correct = 0
            for s0 in range(0, len(yt), 2000):
                logits = functional_call(model, mean, (xt[s0:s0 + 2000],))
                correct += int((logits.argmax(1) == yt[s0:s0 + 2000]).sum())
        acc = correct / len(yt)
        if not np.isfinite(cons):
            acc = float("nan")
        curve.append(acc)
        consensus.append(cons)
        if args.verbose:
            print(f"round {t}: acc {acc:.4f} consensus {cons:.4g} steps {steps} ({time.monotonic() - start:.0f}s)",
                  flush=True)
        if not np.isfinite(cons):
            break
    reached = {str(tg): next((i + 1 for i, a in enumerate(curve) if a >= tg), None) for tg in targets}
    out = {"algorithm": args.algorithm, "beta": beta, "lr": args.lr, "lr-decay": args.lr_decay, "wd": args.wd,
           "local-steps": args.local_steps, "local-epochs": args.local_epochs, "steps-per-round": steps,
           "topology": args.topology, "peers": args.peers, "nodes": n, "alpha": args.alpha,
           "classes-per-client": args.classes_per_client, "rounds": args.rounds,
           "accuracy": curve, "consensus": consensus, "rounds-to-target": reached, "best": max(curve) if curve else None,
           "wall": time.monotonic() - start}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.oledfl_sweep")
    sub = parser.add_subparsers(dest="command", required=True)
    eig = sub.add_parser("eigen")
    eig.add_argument("--nodes", type=int, default=20)
    eig.add_argument("--peers", type=int, default=4)
    eig.add_argument("--betas", default="0,0.3,0.5,0.7,0.9,0.99")
    r = sub.add_parser("run")
    r.add_argument("--algorithm", choices=("dfedavg", "dfedavgm", "oledfl-sgd"), default="dfedavg")
    r.add_argument("--beta", type=float, default=0.99)
    r.add_argument("--momentum", type=float, default=0.9)
    r.add_argument("--rounds", type=int, default=30)
    r.add_argument("--local-steps", type=int, default=20)
    r.add_argument("--local-epochs", type=int, default=1)
    r.add_argument("--batch-size", type=int, default=32)
    r.add_argument("--lr", type=float, default=0.1)
    r.add_argument("--lr-decay", type=float, default=0.998)
    r.add_argument("--wd", type=float, default=5e-4)
    r.add_argument("--nodes", type=int, default=20)
    r.add_argument("--peers", type=int, default=4)
    r.add_argument("--alpha", type=float, default=0.3)
    r.add_argument("--classes-per-client", type=int, default=0, help="> 0: pathological split instead of Dirichlet")
    r.add_argument("--topology", default="random",
                   help="a project topology (random: k-regular; random-draws: the issue-6 graph), "
                        "or 'uniform' (1/(k+1), directed draws)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--targets", default="0.65,0.7,0.75,0.8")
    r.add_argument("--data-dir", default="")
    r.add_argument("--cache-dir", default="")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "eigen":
        print(eigen_report(args.nodes, args.peers, [float(b) for b in args.betas.split(",")]))
        return 0
    result = run(args)
    text = json.dumps(result)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: v for k, v in result.items() if k not in ("accuracy", "consensus")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
