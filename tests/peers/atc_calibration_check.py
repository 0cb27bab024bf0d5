"""Reads the ATC calibration inputs `pi0d export --atc SOC --calibration ...` wrote, as ATC
would (each input's .bin holds `batch_num` samples of the shape its .cfg names), and runs the
exported graphs on them with ONNX Runtime. Prints JSON:

* samples per graph, and whether every value is finite;
* kv_error: for each denoise sample, its step's output with the KV cache from the file against
  the output with the KV cache ONNX Runtime's prefix graph computes from a prefix sample (the
  nearest one): the file's caches are the prefix graph's own;
* chain: for consecutive denoise samples, the step's output on sample s against sample s+1's
  `x_t` (a looped graph's runs of one observation follow each other);
* last_vs_expected: with --expected FILE.safetensors (its `actions`), the last sample's output
  against it.

Usage: atc_calibration_check.py EXPORT_DIR [--expected FILE]
"""

import json
import struct
import sys

import numpy as np
import onnxruntime as ort

TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def config(d, graph):
    text = open(f"{d}/calibration/{graph}.cfg").read()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(": ")
        fields[key] = value
    amct = open(fields["config_file"]).read()
    samples = int(amct.split("batch_num:")[1].strip())
    files = fields["input_data_dir"].split(",")
    shapes = {}
    for s in fields["input_shape"].split(";"):
        name, _, dims = s.partition(":")
        shapes[name] = [int(x) for x in dims.split(",")]
    return files, shapes, samples


def load(d, graph, entry):
    sess = ort.InferenceSession(f"{d}/{entry['file']}", providers=["CPUExecutionProvider"])
    files, shapes, n = config(d, graph)
    inputs = sess.get_inputs()
    names = [i.name for i in inputs]
    if list(shapes) != names or len(files) != len(names):
        sys.exit(f"{graph}: the .cfg names {list(shapes)} ({len(files)} files), the graph takes {names}")
    samples = [dict() for _ in range(n)]
    for i, f in zip(inputs, files):
        if shapes[i.name] != list(i.shape):
            sys.exit(f"{graph}: {i.name} is {i.shape} in the graph, {shapes[i.name]} in the .cfg")
        a = np.fromfile(f, dtype=TYPES[i.type])
        per = int(np.prod(i.shape))
        if a.size != per * n:
            sys.exit(f"{graph}: {f} holds {a.size} values, {n} samples of {i.shape} are {per * n}")
        for s in range(n):
            samples[s][i.name] = a[s * per:(s + 1) * per].reshape(i.shape)
    return sess, samples


def actions(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])["actions"]
    s, e = h["data_offsets"]
    return np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(h["shape"])


def main():
    d = sys.argv[1]
    expected = sys.argv[sys.argv.index("--expected") + 1] if "--expected" in sys.argv else None
    m = json.load(open(f"{d}/manifest.json"))
    ps, pre = load(d, "prefix", m["graphs"]["prefix"])
    ds, den = load(d, "denoise", m["graphs"]["denoise"])
    finite = all(
        np.isfinite(v.astype(np.float64)).all() for s in pre + den for v in s.values()
    )
    caches = [ps.run(None, feed)[0] for feed in pre]
    outs, kv_error = [], 0.0
    for feed in den:
        out = ds.run(None, feed)[0]
        nearest = min(
            float(np.abs(out - ds.run(None, {**feed, "kv_cache": kv})[0]).max()) for kv in caches
        )
        kv_error = max(kv_error, nearest)
        outs.append(out)
    x_name = "x_t" if "x_t" in den[0] else "noise"
    chain = [float(np.abs(outs[s] - den[s + 1][x_name]).max()) for s in range(len(den) - 1)]
    report = {
        "prefix_samples": len(pre),
        "denoise_samples": len(den),
        "finite": bool(finite),
        "kv_error": kv_error,
        "chain": chain,
        "image_range": [float(min(s["image0"].min() for s in pre)), float(max(s["image0"].max() for s in pre))],
    }
    if expected:
        report["last_vs_expected"] = float(np.abs(outs[-1] - actions(expected)).max())
    print(json.dumps(report))


main()
