"""What a server checkpoint costs against a round, for the default config and a diffusion config.

    python benchmarks/checkpoint_cost.py [--rounds 3] [--out benchmarks/results/checkpoint-cost.md]

`checkpoint-every` decides how much work a crash loses; issue 22's rule: checkpoint every round
unless a checkpoint costs more than 5 % of a round. Each config runs `--rounds` rounds in process
(`fedsynth.inprocess`: the real ServerApp and ClientApp code, the nodes one after the other, no
Flower engine) with `checkpoint-every = 1`; every `save_checkpoint` call is timed, and its median
is set against the median `round-time` of `metrics.jsonl` (rounds 2.. : the first pays start-up
costs). A round in process is the nodes' work added up, so on a machine that runs k nodes at a
time a real round is about 1/k of it: the report gives the ratio for k = 1 and for k = 2 cores.

- `default`: `make run`'s config (pyproject.toml's defaults, 10 nodes);
- `fedddpm`: the FedDDPM preset's `cpu` size (unet-small on 8x8 Fashion-MNIST, aux-fraction 0.02,
  10 nodes), with a 20-step warmup and no FID (neither changes what a checkpoint holds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "fedddpm": {
        "algorithm": "fedddpm", "dataset": "fashion-mnist", "model": "unet-small", "image-size": 8,
        "local-test-fraction": 0.0, "local-steps": 20, "batch-size": 64, "lr": 2e-3, "warmup-steps": 20,
        "aux-fraction": 0.02, "sampler": "ddim", "ddim-steps": 5, "fid-samples": 16, "fid-every": 0,
        "aggregation": "uniform", "local-optimizer": "adam", "partition": "shard",
    },
}
NUM_NODES = 10


def measure(name: str, overrides: dict[str, Any], rounds: int, work: Path) -> dict[str, Any]:
    import server_app.recorder as loop  # the module that writes the checkpoints
    from fedsynth.inprocess import InProcessGrid, run_federation

    times: list[float] = []
    original = loop.save_checkpoint

    def timed(*args: Any, **kwargs: Any) -> Path:
        start = time.perf_counter()
        path = original(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return path

    raw = {**overrides, "num-server-rounds": rounds, "checkpoint-every": 1, "results-dir": str(work),
           "run-name": name, "cache-dir": str(work / "cache")}
    loop.save_checkpoint = timed
    try:
        run_federation(raw, InProcessGrid(NUM_NODES, raw))
    finally:
        loop.save_checkpoint = original
    metrics = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    round_times = [r["round-time"] for r in metrics if r.get("round", 0) >= 2 and "round-time" in r]
    ckpt = statistics.median(times[1:] or times)
    round_time = statistics.median(round_times)
    return {"config": name, "checkpoint-bytes": (work / name / "checkpoint.safetensors").stat().st_size,
            "checkpoint-s": ckpt, "round-s": round_time, "ratio-1": ckpt / round_time,
            "ratio-2": ckpt / (round_time / 2), "checkpoint-times": times, "round-times": round_times}


def report(rows: list[dict[str, Any]], rounds: int) -> str:
    lines = [f"# Checkpoint cost against round time ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `python benchmarks/checkpoint_cost.py --rounds {rounds}` (in process, {NUM_NODES} nodes, "
             "checkpoint-every = 1; medians, rounds 2..).", "",
             "| config | checkpoint size | checkpoint write (s) | round in process (s) | checkpoint / round | "
             "... with 2 nodes at a time |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['config']} | {row['checkpoint-bytes'] / 1e6:.2f} MB | {row['checkpoint-s']:.4f} | "
                     f"{row['round-s']:.2f} | {100 * row['ratio-1']:.2f} % | {100 * row['ratio-2']:.2f} % |")
    lines.append("")
    for row in rows:
        lines.append(f"- {row['config']}: checkpoint writes (s) "
                     f"{', '.join(f'{t:.4f}' for t in row['checkpoint-times'])}; round times (s) "
                     f"{', '.join(f'{t:.2f}' for t in row['round-times'])}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            rows.append(measure(name, CONFIGS[name], args.rounds, Path(tmp)))
            print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("times")}), flush=True)
    text = report(rows, args.rounds)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
