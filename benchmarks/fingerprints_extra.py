"""Fingerprints of the client rules that benchmarks/fingerprints.py does not run.

benchmarks/fingerprints.py runs six algorithms on two models. A change to how a node reads its settings (issue 52:
the ClientApp reads them from the train message) or to the algorithm table (generated `X+cog` rows) can change any
rule, so this runs one short run of each other rule (its settings, a codec, `cog = true`, an lr decay) the same way:
`fingerprint_run` of benchmarks/fingerprints.py, mlp unless stated, 3 nodes, 3 rounds. Compare the lines before and
after a change that must not change results.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fingerprints_extra.py [NAME ...] > FILE
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fingerprints import COMMON, DEFAULT_DATA_DIR, fingerprint_run  # noqa: E402

COG = {"gen-steps": 2, "gen-budget": 8}
EXTRA: dict[str, dict] = {
    "fedprox": {"algorithm": "fedprox", "proximal-mu": 0.1},
    "moon": {"algorithm": "moon", "model": "cnn"},
    "fedsam": {"algorithm": "fedsam", "sam-rho": 0.1},
    "mofedsam": {"algorithm": "mofedsam", "lr-decay": 0.9},
    "fedgamma": {"algorithm": "fedgamma"},
    "fedlesam-d": {"algorithm": "fedlesam-d", "compression": "topk", "error-feedback": True},
    "fedsmoo": {"algorithm": "fedsmoo"},
    "fedlesam-s": {"algorithm": "fedlesam-s", "compression": "qsgd", "qsgd-scope": "bucket", "qsgd-bucket": 64},
    "dfedavgm": {"algorithm": "dfedavgm", "lr-decay": 0.95},
    "dfedsam": {"algorithm": "dfedsam"},
    "oledfl-sam": {"algorithm": "oledfl-sam", "lr-decay": 0.998},
    "dpsgd": {"algorithm": "dpsgd"},
    "fedprox+cog": {"algorithm": "fedprox+cog", **COG},
    "moon+cog": {"algorithm": "moon+cog", "model": "cnn", **COG, "cog-ablation": "hard-label"},
    "scaffold-cogflag": {"algorithm": "scaffold", "cog": True, **COG, "kd-weighting": "fixed", "cog-start-round": 0},
    "fedavgm-cog-noise": {"algorithm": "fedavgm+cog", "gen-budget": 8, "cog-ablation": "noise", "lr-decay": 0.9},
    # the four arms of studies/fedcog-bounded-influence.toml, small (3 nodes: not its pairs partition): its runs
    # came from several commits
    **{f"study-{algorithm}{suffix}": {"algorithm": algorithm, "model": "cnn", "momentum": 0.9, "weight-decay": 1e-5,
                                     "alpha": 0.05, **bounds,  # unequal nodes: the weight cap binds
                                     **({**COG, "cog-start-round": 2, "kd-weighting": "balanced"} if "cog" in algorithm
                                        else {})}
       for algorithm in ("fedavg", "fedavg+cog")
       for suffix, bounds in (("", {}), ("-bounded", {"bounded-influence": True}))},
    # the five arms of studies/fedsynsam-confound.toml, small (3 nodes, 3 rounds; its Path(1) split, bucketed qsgd,
    # lr, rho, beta and uniform mean): its runs came from ten commits (benchmarks/results/fingerprints-confound-study.md)
    **{f"confound-{arm}": {"algorithm": "fedsam" if arm == "fedsam" else "fedsynsam", "partition": "pathological",
                           "classes-per-client": 1, "lr": 0.2, "sam-rho": 0.05, "synsam-beta": 0.9,
                           "compression": "qsgd", "qsgd-scope": "bucket", "qsgd-bucket": 512, "levels": 17,
                           "aggregation": "uniform", "trajectory-rounds": 1, "distill-iterations": 5,
                           "synthetic-ipc": 2, **keys}
       for arm, keys in (("fedsam", {}), ("fedsynsam", {}), ("fedsynsam-normalized", {"synsam-mix": "normalized"}),
                         ("fedsynsam-oracle", {"synthetic-source": "real-oracle"}),
                         ("fedsynsam-oracle-normalized", {"synthetic-source": "real-oracle",
                                                          "synsam-mix": "normalized"}))},
}


def main(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(EXTRA):
            row = fingerprint_run(name, {**COMMON, "model": "mlp", **EXTRA[name]}, DEFAULT_DATA_DIR, Path(tmp))
            print(f"{row['run']:<22} {row['sha256']}  accuracy={row['final-central-accuracy']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
