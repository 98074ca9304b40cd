"""OledFL diagnostic (issue 18): how much a node's K local steps amplify a change of its start point.

    PYTHONPATH=. python -m benchmarks.oledfl_jacobian [--nodes 100 --peers 10 --model mlp \
        --local-epochs 5 --batch-size 128 --lr 0.1 --clip 10 --warmup 3 --rounds 8 \
        --betas 0,0.5,0.8,0.9,0.99] [--out FILE.json]

Why: OledFL starts node i's local training from x_i + beta (x_i - z_i^{t-1})
instead of x_i. Linearising the K local steps F around the nodes' common
trajectory, with Q = dF/ds their Jacobian, the nodes' disagreement e (models
minus their mean) evolves as

    e^t ~ Q ((1+beta) W_t - beta I) e^{t-1},

so per round it shrinks or grows in mean square by about q^2 c(beta), where
c(beta) = `common.algorithms.mixing_spectrum.ole_gossip_contraction` (Ole's gossip alone on
this topology) and q = ||Q v|| / ||v|| along the directions the
disagreement occupies. For the full graph c(beta) = beta^2: the investigation's
"beta rho(Q) < 1". Where q > 1 (local training expands a direction), beta must
stay below the value at which q^2 c(beta) = 1, well below where the gossip
alone would diverge (c(beta) = 1).

What it does, in one process without Flower (the project's split, seeded x^0,
batch order, mixing matrices, lr decay, SGD with weight decay and clipping,
as `benchmarks/oledfl_sweep.py`):
1. `--warmup` rounds of DFedAvg from x^0 (the nodes' state at round t0);
2. at round t0, for `--probe-nodes` nodes: K local steps from s = x_i and
   from s + delta with the same batches; the gain ||F(s+delta) - F(s)|| /
   ||delta|| for delta along the Ole direction x_i - z_i^{t0-1} (scaled by a
   small and by the paper's beta, i.e. the real restart) and for random
   delta of the same norms;
3. the predicted beta at which the disagreement grows: the smallest beta with
   q^2 c(beta) >= 1, with q the gain along the Ole direction;
4. the observed one: from the same state, `--rounds` rounds of OledFL-SGD for
   every beta in `--betas`, the consensus distance (1/N) sum ||z_i - x-bar||^2
   per round and its mean growth factor per round; the observed beta is the
   smallest one whose consensus distance grows per round (factor > 1) and
   faster than DFedAvg's (beta = 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def predicted_beta(gain: float, contraction) -> float | None:
    """Smallest beta on a 0.001 grid in [0, 1) where gain^2 * contraction(beta) >= 1 (None: none below 1)."""
    for beta in np.arange(0.0, 1.0, 0.001):
        if gain**2 * contraction(float(beta)) >= 1.0:
            return round(float(beta), 3)
    return None


def growth_factor(distances: list[float]) -> float:
    """Geometric-mean factor per round between the first and last consensus distance (inf if it blew up)."""
    if len(distances) < 2 or not np.isfinite(distances[-1]):
        return float("inf")
    if distances[0] <= 0:
        return float("nan")
    return float((distances[-1] / distances[0]) ** (1.0 / (len(distances) - 1)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.oledfl_jacobian", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--peers", type=int, default=10)
    parser.add_argument("--topology", default="random")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--lr-decay", type=float, default=0.998)
    parser.add_argument("--wd", type=float, default=5e-4)
    parser.add_argument("--clip", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3, help="DFedAvg rounds before the probe")
    parser.add_argument("--rounds", type=int, default=8, help="OledFL rounds per beta after the warm-up")
    parser.add_argument("--betas", default="0,0.5,0.8,0.9,0.99")
    parser.add_argument("--probe-nodes", type=int, default=5)
    parser.add_argument("--small", type=float, default=0.05, help="the small scale of the Ole direction (linear regime)")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch
    from torch.func import functional_call

    from client_app.training import batch_indices
    from common.run.config import parse_run_config
    from benchmarks.oledfl_sweep import node_tensors
    from common.run.task import make_model
    from common.algorithms.mixing_spectrum import ole_gossip_contraction
    from common.algorithms.topology import RANDOM_TOPOLOGIES, mixing_matrix
    from server_app.registry import SERVER_STRATEGIES, decayed_lr

    torch.set_num_threads(args.threads)
    wall = time.monotonic()
    raw = {"algorithm": "dfedavg", "dataset": "fashion-mnist", "model": args.model, "partition": "dirichlet",
           "alpha": args.alpha, "local-epochs": args.local_epochs, "local-steps": args.local_steps,
           "batch-size": args.batch_size, "lr": args.lr, "lr-decay": args.lr_decay, "weight-decay": args.wd,
           "clip-grad-norm": args.clip, "seed": args.seed, "data-dir": args.data_dir, "cache-dir": args.cache_dir,
           "device": "cpu", "topology": args.topology, "peers": args.peers}
    cfg = parse_run_config(raw, SERVER_STRATEGIES)
    n = args.nodes
    xs, ys, xt, yt = node_tensors(cfg, n)
    model = make_model(cfg, seeded=True)
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]

    def unflatten(vector: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v.reshape(s) for k, v, s in zip(names, torch.split(vector, sizes), shapes)}

    def local_steps(start: torch.Tensor, node: int, t: int) -> torch.Tensor:
        """K steps of the project's local SGD (clip, then weight decay) from a flat start; returns the flat end."""
        p = [v.clone().requires_grad_(True) for v in unflatten(start.float()).values()]
        lr = decayed_lr(cfg.lr, cfg.lr_decay, t)
        for idx in batch_indices(len(ys[node]), cfg, t, node):
            index = torch.from_numpy(idx)
            loss = torch.nn.functional.cross_entropy(
                functional_call(model, dict(zip(names, p)), (xs[node][index],)), ys[node][index])
            grads = torch.autograd.grad(loss, p)
            with torch.no_grad():
                if cfg.clip_grad_norm > 0:
                    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
                    scale = min(1.0, cfg.clip_grad_norm / (float(norm) + 1e-6))
                    grads = [g * scale for g in grads]
                for q, g in zip(p, grads):
                    q.sub_(lr * (g + cfg.weight_decay * q))
        return torch.cat([q.detach().reshape(-1) for q in p]).double()

    def accuracy(mean: torch.Tensor) -> float:
        with torch.no_grad():
            params = unflatten(mean.float())
            correct = sum(int((functional_call(model, params, (xt[s:s + 2000],)).argmax(1) == yt[s:s + 2000]).sum())
                          for s in range(0, len(yt), 2000))
        return correct / len(yt)

    def matrix(t: int) -> torch.Tensor:
        return torch.tensor(mixing_matrix(cfg.topology, n, peers=cfg.peers, seed=cfg.seed, round_num=t,
                                          mixing=cfg.mixing), dtype=torch.float64)

    def gossip_round(z: torch.Tensor, t: int, beta: float) -> torch.Tensor:
        """One round of OledFL-SGD (DFedAvg for beta = 0) for all nodes: rows of z are the nodes' flat models."""
        x = matrix(t) @ z
        starts = x + beta * (x - z)
        return torch.stack([local_steps(starts[i], i, t) for i in range(n)])

    def consensus(z: torch.Tensor) -> float:
        return float(((z - z.mean(0)) ** 2).sum() / n)

    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    z = x0.repeat(n, 1)
    log = {"config": vars(args) | {"out": str(args.out) if args.out else None}, "warmup": []}
    for t in range(1, args.warmup + 1):
        z = gossip_round(z, t, 0.0)
        log["warmup"].append({"round": t, "accuracy": accuracy(z.mean(0)), "consensus": consensus(z)})
        print(f"warm-up round {t}: {log['warmup'][-1]} ({time.monotonic() - wall:.0f}s)", flush=True)

    # --- the probe: gains of the K-step map at round t0 ---
    t0 = args.warmup + 1
    x = matrix(t0) @ z
    betas = [float(b) for b in args.betas.split(",")]
    paper_beta = max(betas)
    generator = torch.Generator().manual_seed(args.seed)
    probes = []
    for i in range(min(args.probe_nodes, n)):
        s = x[i]
        direction = x[i] - z[i]
        base = local_steps(s, i, t0)
        row = {"node": i, "ole-direction-norm": float(direction.norm()), "start-norm": float(s.norm())}
        for label, scale in (("small", args.small), ("paper-beta", paper_beta)):
            delta = scale * direction
            random = torch.randn(len(s), generator=generator, dtype=torch.float64)
            random *= delta.norm() / random.norm()
            for kind, d in (("ole", delta), ("random", random)):
                change = local_steps(s + d, i, t0) - base
                row[f"gain-{kind}-{label}"] = float(change.norm() / d.norm())
                row[f"along-{kind}-{label}"] = float(change @ d / (d @ d))  # component of Q d along d
        probes.append(row)
        print(f"probe node {i}: {row} ({time.monotonic() - wall:.0f}s)", flush=True)
    log["probes"] = probes

    ws = [mixing_matrix(cfg.topology, n, peers=cfg.peers, seed=cfg.seed, round_num=t, mixing=cfg.mixing)
          for t in range(1, 41)]
    contraction = {round(float(b), 3): ole_gossip_contraction(ws, float(b), exchangeable=cfg.topology in RANDOM_TOPOLOGIES) for b in np.arange(0.0, 1.0, 0.001)}

    def c(beta: float) -> float:
        return contraction[round(beta, 3)]

    gains = {key: float(np.mean([p[key] for p in probes])) for key in probes[0] if key.startswith("gain-")}
    log["gains"] = gains
    log["gossip-contraction"] = {f"{b:g}": c(b) for b in betas}
    log["predicted-beta"] = {
        "gossip alone (q = 1)": predicted_beta(1.0, c),
        "q = gain along the Ole direction, small": predicted_beta(gains["gain-ole-small"], c),
        f"q = gain along the Ole direction, beta {paper_beta:g}": predicted_beta(gains["gain-ole-paper-beta"], c),
        "q = gain along a random direction, small": predicted_beta(gains["gain-random-small"], c),
    }
    print(json.dumps({"gains": gains, "predicted-beta": log["predicted-beta"]}), flush=True)

    # --- the observed: OledFL from the same state at every beta ---
    observed = []
    for beta in betas:
        zb, distances, accs = z.clone(), [consensus(z)], []
        for t in range(t0, t0 + args.rounds):
            zb = gossip_round(zb, t, beta)
            distances.append(consensus(zb))
            accs.append(accuracy(zb.mean(0)) if np.isfinite(distances[-1]) else float("nan"))
            if not np.isfinite(distances[-1]):
                break
        row = {"beta": beta, "consensus": distances, "accuracy": accs, "growth-per-round": growth_factor(distances),
               "predicted-growth-ms": gains["gain-ole-small"] ** 2 * c(beta)}
        observed.append(row)
        print(f"beta {beta:g}: growth {row['growth-per-round']:.3f}/round, consensus {distances}, "
              f"accuracy {accs} ({time.monotonic() - wall:.0f}s)", flush=True)
    log["observed"] = observed
    # "grows": the consensus distance rises per round, and faster than DFedAvg's (whose heterogeneous
    # gradients alone can make it rise while the nodes drift from x^0)
    floor = max([1.0] + [r["growth-per-round"] for r in observed if r["beta"] == 0.0])
    log["observed-beta"] = next((r["beta"] for r in observed if r["growth-per-round"] > floor), None)
    log["wall-seconds"] = time.monotonic() - wall
    text = json.dumps(log)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: log[k] for k in ("gains", "gossip-contraction", "predicted-beta", "observed-beta",
                                          "wall-seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
