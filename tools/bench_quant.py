#!/usr/bin/env python3
"""pi0d's quantized schemes side by side on one pi0-shaped model, against lerobot's f32 actions.

    cargo build --release --features onnx
    ~/venvs/golden/bin/python tools/bench_quant.py [--threads 2] [--depth 1] [--repeat 3]

Builds the pi0-shaped model of tools/bench_pi0.py (real widths: SigLIP 1152 x 4304, Gemma
2048 x 16384, expert 1024 x 4096; depth reduced to --depth; random f32 weights; 2 cameras, 48
prompt tokens), runs lerobot's `sample_actions` on it once for the reference actions, then for
f32 and each scheme `pi0d quantize` writes (bf16, w8, w8a8, w4) runs `pi0d infer` on the same inputs
and noise, and prints per scheme: the whole chunk's time and its ratio to f32, the cosine and
largest absolute difference of the actions against lerobot's, the resident weights (every
tensor but the text embedding, which is read a row at a time from the mapped file) and pi0d's
peak RSS against them.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pi0 as bp  # noqa: E402

BIN = bp.BIN


def resident_bytes(ck: Path) -> int:
    """Bytes of every tensor in model.safetensors but the text embedding / LM head."""
    raw = (ck / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    total = 0
    for name, t in header.items():
        if name == "__metadata__" or "embed_tokens" in name or "lm_head" in name:
            continue
        a, b = t["data_offsets"]
        total += b - a
    return total


def lerobot_actions(policy, batch) -> torch.Tensor:
    m = policy.model
    images = [batch["image0"], batch["image1"]]
    masks = [batch["img_mask0"].bool(), batch["img_mask1"].bool()]
    with torch.no_grad():
        return m.sample_actions(images, masks, batch["lang_tokens"], batch["lang_masks"].bool(),
                                batch["state"], noise=batch["noise"].clone())


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    g, w = got.flatten().double(), want.flatten().double()
    cos = float(torch.dot(g, w) / (g.norm() * w.norm()))
    return cos, float((g - w).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not BIN.exists():
        sys.exit(f"{BIN} missing: run `cargo build --release` first")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "f32"
        policy, batch = bp.build("pi0", args.depth, src)
        want = lerobot_actions(policy, batch)
        del policy
        rows = []
        for scheme in ["f32", "bf16", "w8", "w8a8", "w4"]:
            ck = src
            if scheme != "f32":
                ck = Path(tmp) / scheme
                subprocess.run([str(BIN), "quantize", "--checkpoint", str(src), "--out", str(ck),
                                "--scheme", scheme], check=True, capture_output=True)
                (ck / "inputs.safetensors").write_bytes((src / "inputs.safetensors").read_bytes())
            r = bp.pi0d_times(ck, args.threads, args.repeat)
            got = load_file(str(ck / "actions.safetensors"))["actions"]
            cos, err = compare(got, want)
            rows.append((scheme, r, cos, err, resident_bytes(ck) / 2**20))
        base = rows[0][1]["total_ms"]
        print(f"\npi0-shaped, depth {args.depth}, 2 cameras, 48 tokens, {args.threads} threads; "
              "actions against lerobot's f32 (PyTorch CPU)")
        print(f"  {'scheme':7} {'chunk ms':>9} {'x f32':>6} {'cosine':>9} {'max err':>8} "
              f"{'weights MiB':>12} {'peak RSS MiB':>13} {'RSS/weights':>12}")
        for scheme, r, cos, err, weights in rows:
            print(f"  {scheme:7} {r['total_ms']:9.1f} {r['total_ms'] / base:6.2f} {cos:9.6f} {err:8.1e} "
                  f"{weights:12.0f} {r['rss_mb']:13.0f} {r['rss_mb'] / weights:12.2f}")


if __name__ == "__main__":
    main()
