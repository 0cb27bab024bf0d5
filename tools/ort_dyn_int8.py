#!/usr/bin/env python3
"""ONNX Runtime's own dynamic int8 quantization of a `pi0d export` directory (tools/bench_quant.py).

    .venv/bin/python tools/ort_dyn_int8.py GRAPHS_F32 OUT

Each graph manifest.json names goes through `onnxruntime.quantization.quantize_dynamic`: int8
weights per tensor (weight type QInt8) for the MatMuls with a constant weight (the linear
layers; the attention products take two activations and stay f32), activations quantized to
uint8 at run time (MatMulInteger). A graph whose weights were external data stays so (the real
model's int8 prefix is still above protobuf's 2 GB). manifest.json is copied with each graph's
weight bytes and external data file updated, so `pi0d infer --backend onnx --model-dir OUT`
runs it. Needs the onnxruntime and onnx packages (the test venv, .venv).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic


def initializer_bytes(path: Path) -> int:
    m = onnx.load(str(path), load_external_data=False)
    total = 0
    for t in m.graph.initializer:
        size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        total += size * math.prod(t.dims)
    return total


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    manifest = json.loads((src / "manifest.json").read_text())
    out.mkdir(parents=True)
    for entry in manifest["graphs"].values():
        external = bool(entry.get("external_data"))
        quantize_dynamic(
            src / entry["file"], out / entry["file"],
            # The linear layers only, as pi0d's schemes and torch's nn.Linear quantization: the
            # defaults would also take the patch Conv and the embedding Gather.
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            use_external_data_format=external,
        )
        if external:
            # quantize_dynamic names it after the graph file.
            entry["external_data"] = entry["file"] + ".data"
        else:
            entry.pop("external_data", None)
        entry["weight_bytes"] = initializer_bytes(out / entry["file"])
        entry["nodes"] = len(onnx.load(str(out / entry["file"]), load_external_data=False).graph.node)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
