"""Throughput and wire size of the uplink codecs in common/uplink/ (spec, quantizers, payloads).

Usage: ``python benchmarks/codecs.py [--out FILE] [--size N] [--repeats R]``

Encodes and decodes one float32 tensor of ``--size`` elements (default 1M)
with each codec SPEC §3.5 runs in the papers (qsgd 4/8 bits on the wire, the
FedSynSAM paper's 17/257-level whole-update qsgd, buckets, top-k 0.1/0.25)
plus ``none``, on one thread, and reports the best of ``--repeats`` timings
as MB/s of float32 input (1 MB = 10^6 bytes) together with payload bytes
against float32. A second table weighs one update of the default CNN
(44,426 parameters in 8 tensors) as Flower counts it on the wire (the
``.npy`` headers and key names included) under each qsgd scope and level
count, against the float32 model record it replaces: per-tensor payloads pay
metadata per tensor, a whole-update payload once. The markdown is printed and
written to ``--out``; the same numbers go to a JSON file next to it.
"""

from __future__ import annotations

import os

# Pin BLAS (used by np.dot in the qsgd norm) to one thread before numpy loads,
# so the figures are single-core figures.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run as a script, only benchmarks/ is on sys.path; the codecs live in common/.
sys.path.insert(0, str(REPO_ROOT))

from common.uplink.payloads import decode_update, encode_update, float32_nbytes, payload_nbytes  # noqa: E402
from common.algorithms.codec_settings import CodecSettings, paper_levels  # noqa: E402

CODECS: dict[str, CodecSettings] = {
    "none": CodecSettings("none"),
    "qsgd 7 levels (4 bits/coord)": CodecSettings("qsgd", bits=4),
    "qsgd 127 levels (8 bits/coord)": CodecSettings("qsgd", bits=8),
    "qsgd model, 17 levels (6 bits/coord; paper's 4-bit)": CodecSettings("qsgd", levels=paper_levels(4), qsgd_scope="model"),
    "qsgd model, 257 levels (10 bits/coord; paper's 8-bit)": CodecSettings("qsgd", levels=paper_levels(8), qsgd_scope="model"),
    "qsgd bucket 512, 17 levels (6 bits/coord)": CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=512),
    "topk 0.1": CodecSettings("topk", topk_ratio=0.1),
    "topk 0.25": CodecSettings("topk", topk_ratio=0.25),
}

# The default CNN's update under each qsgd scope and level count (wire sizes, metadata included).
CNN_CODECS: dict[str, CodecSettings] = {
    "tensor, 7 levels (4 bits/coord)": CodecSettings("qsgd", bits=4),
    "model, 7 levels (4 bits/coord)": CodecSettings("qsgd", bits=4, qsgd_scope="model"),
    "tensor, 17 levels (6 bits/coord)": CodecSettings("qsgd", levels=17),
    "model, 17 levels (6 bits/coord; paper's 4-bit)": CodecSettings("qsgd", levels=17, qsgd_scope="model"),
    "bucket 512, 17 levels (6 bits/coord)": CodecSettings("qsgd", levels=17, qsgd_scope="bucket", qsgd_bucket=512),
    "model, 257 levels (10 bits/coord; paper's 8-bit)": CodecSettings("qsgd", levels=257, qsgd_scope="model"),
    "tensor, 127 levels (8 bits/coord)": CodecSettings("qsgd", bits=8),
    "topk 0.1 (per tensor)": CodecSettings("topk", topk_ratio=0.1),
}


@dataclass(frozen=True)
class WireResult:
    """One CNN update's wire size under one codec, as Flower counts it."""

    codec: str
    payload_bytes: int
    wire_bytes: int
    float32_wire_bytes: int
    ratio: float
    bits_per_parameter: float


def cnn_wire_sizes() -> tuple[int, list[WireResult]]:
    """Wire bytes of one default-CNN update (random values) per codec against its float32 model record."""
    from common.run.config import RunConfig
    from common.records import to_record
    from common.run.task import make_model

    weights = {k: v.numpy() for k, v in make_model(RunConfig(model="cnn")).state_dict().items()}
    n = sum(w.size for w in weights.values())
    rng = np.random.default_rng(0)
    delta = {k: rng.standard_normal(w.shape).astype(np.float32) for k, w in weights.items()}
    float32_wire = to_record(delta).count_bytes()
    results = []
    for name, spec in CNN_CODECS.items():
        payload = encode_update(dict(sorted(delta.items())), spec, np.random.default_rng(1))
        wire = to_record(payload).count_bytes()
        results.append(WireResult(name, payload_nbytes(payload), wire, float32_wire, float32_wire / wire, 8 * wire / n))
    return n, results


def wire_table(n: int, results: list[WireResult]) -> str:
    """The CNN wire-size table."""
    lines = [
        "",
        f"One update of the default CNN ({n:,} parameters, 8 tensors) as Flower counts it on the wire "
        "(`ArrayRecord.count_bytes`: array bytes with their .npy headers, plus key names), against the float32 "
        f"model record it replaces ({results[0].float32_wire_bytes:,} B). bits/param = 8 x wire bytes / parameters.",
        "",
        "| qsgd scope, levels | payload bytes | wire bytes | ratio vs float32 record | bits/param on the wire |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r.codec} | {r.payload_bytes:,} | {r.wire_bytes:,} | {r.ratio:.2f} | {r.bits_per_parameter:.3f} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class CodecResult:
    """Best-of-repeats timings and sizes for one codec."""

    codec: str
    encode_ms: float
    decode_ms: float
    encode_mb_s: float
    decode_mb_s: float
    round_trip_mb_s: float
    payload_bytes: int
    float32_bytes: int
    ratio: float


def measure(spec: CodecSettings, tensor: np.ndarray, repeats: int, name: str) -> CodecResult:
    """Time encode and decode of ``tensor`` separately, keeping the best of ``repeats``.

    The minimum is the least noisy estimate of what the code itself costs; the
    first, untimed call warms caches and page-faults the buffers.
    """
    delta = {"tensor": tensor}
    shapes = {"tensor": tensor.shape}
    rng = np.random.default_rng(0)
    decode_update(encode_update(delta, spec, rng), shapes, spec)
    encode_s, decode_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        payload = encode_update(delta, spec, rng)
        middle = time.perf_counter()
        decode_update(payload, shapes, spec)
        end = time.perf_counter()
        encode_s.append(middle - start)
        decode_s.append(end - middle)
    best_encode, best_decode = min(encode_s), min(decode_s)
    input_mb = tensor.nbytes / 1e6
    sent, raw = payload_nbytes(payload), float32_nbytes(shapes)
    return CodecResult(
        codec=name,
        encode_ms=best_encode * 1e3,
        decode_ms=best_decode * 1e3,
        encode_mb_s=input_mb / best_encode,
        decode_mb_s=input_mb / best_decode,
        round_trip_mb_s=input_mb / (best_encode + best_decode),
        payload_bytes=sent,
        float32_bytes=raw,
        ratio=raw / sent,
    )


def markdown_table(results: list[CodecResult], size: int, repeats: int) -> str:
    """Render the results as a markdown table with a one-line context header."""
    lines = [
        f"Codecs on one float32 tensor of {size:,} elements, one thread, best of {repeats} "
        f"(numpy {np.__version__}, Python {platform.python_version()}, {platform.machine()}; "
        f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: timings above a load of the core "
        "count are slowed by other processes, the sizes are exact).",
        "MB/s are MB of float32 input per second (1 MB = 10^6 B); ratio = float32 bytes / payload bytes.",
        "",
        "| codec | encode ms | decode ms | encode MB/s | decode MB/s | encode+decode MB/s "
        "| payload bytes | ratio vs float32 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.codec} | {r.encode_ms:.2f} | {r.decode_ms:.2f} | {r.encode_mb_s:,.0f} "
            f"| {r.decode_mb_s:,.0f} | {r.round_trip_mb_s:,.0f} | {r.payload_bytes:,} "
            f"| {r.ratio:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run every codec, print the table and write the markdown and JSON files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/codecs.md")
    parser.add_argument("--size", type=int, default=1_000_000, help="elements in the tensor")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per codec")
    args = parser.parse_args(argv)

    tensor = np.random.default_rng(0).standard_normal(args.size).astype(np.float32)
    results = [measure(spec, tensor, args.repeats, name) for name, spec in CODECS.items()]
    table = markdown_table(results, args.size, args.repeats)
    n_cnn, wire = cnn_wire_sizes()
    table += wire_table(n_cnn, wire)
    print(table, end="")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    report = {
        "size": args.size,
        "repeats": args.repeats,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": [asdict(r) for r in results],
        "cnn-parameters": n_cnn,
        "cnn-wire": [asdict(r) for r in wire],
    }
    json_path = args.out.with_suffix(".json")
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} and {json_path}")


if __name__ == "__main__":
    main()
