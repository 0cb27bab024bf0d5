#!/usr/bin/env python3
"""pi0d's quantized schemes beside PyTorch's and ONNX Runtime's, on one pi0-shaped model, against
lerobot's f32 actions, all measured in one run.

    cargo build --release --features onnx
    ./tools/test.sh            # once: makes .venv (onnxruntime's library and its Python package)
    ~/venvs/golden/bin/python tools/bench_quant.py [--threads 2] [--depth 1] [--repeat 3]
        [--only pi0d,torch,ort] [--bin target/release/pi0d] [--onnx-library LIB]
    ~/venvs/golden/bin/python tools/bench_quant.py --full [--repeat 1] [--workdir DIR]

`--full` builds the real pi0 at full size as `tools/bench_pi0.py --full` does (lerobot's bf16
mode, random weights) and prints pi0d's bf16, w8, w8a8 and w4 on it: the chunk's time, the
actions against lerobot's own bf16 ones, the resident weights and the peak RSS (about 25 GB of
disk and 16 GB of memory). Without it:

Builds the pi0-shaped model of tools/bench_pi0.py (real widths: SigLIP 1152 x 4304, Gemma
2048 x 16384, expert 1024 x 4096; depth reduced to --depth; random f32 weights; 2 cameras, 48
prompt tokens) and runs lerobot's `sample_actions` on it once for the reference actions. Then,
on the same inputs and noise, each row:

* `pi0d f32`, and `pi0d bf16|w8|w8a8|w4` on the checkpoint `pi0d quantize` writes: `pi0d infer`.
* `pi0d w8|w8a8|w4 calibrated`: the same with `--calibration` on two other inputs files (other
  images, prompt, state and noise than the measured one's; GPTQ rounding and the scale search);
  the time `pi0d quantize` took is printed below the table.
* `torch f32`: lerobot's `sample_actions`, the policy loaded by lerobot's `from_pretrained`.
* `torch dyn-int8`: the same after `torch.ao.quantization.quantize_dynamic` of every nn.Linear
  to qint8 (int8 weights per tensor, activations quantized per call; compute in f32 around them).
* `ort f32`, `ort w8`, `ort w4`: `pi0d export` graphs (`--quant w8`: int8 initializers through
  DequantizeLinear into MatMul; `--quant w4`: com.microsoft MatMulNBits) run by
  `pi0d infer --backend onnx` on ONNX Runtime's CPU provider (the library of .venv's wheel).
* `ort dyn-int8`: ONNX Runtime's own `quantize_dynamic` (QInt8 weights) of the f32 graphs'
  linear MatMuls (tools/ort_dyn_int8.py, under .venv's Python), run the same way.

Printed per row: the whole chunk's median time over --repeat runs after one warm-up (in the
process that loaded the model) and its ratio to pi0d f32's; the cosine and largest absolute
difference of the actions against lerobot's f32; the resident weights (pi0d and torch: every
tensor but the text embedding / LM head, which pi0d reads a row at a time from the mapped
file; ONNX Runtime: the graph files, embedding included, a few MB here, but without the last
language layer's query, output and MLP, which the export leaves out since only that layer's keys
and values are used: at --depth 1 that is most of the language model, so ORT's weights and RSS
are not comparable with the others' there); and the process's peak RSS (/usr/bin/time) against
them. A torch process's peak includes importing torch and lerobot (most of it on this small
model) and lerobot's loading (the randomly initialised model, then the loaded copy); both are
printed below the table, with its peak over the runs alone. A row that cannot be measured
(a pi0d built without `--features onnx`, no .venv) says why instead of ending the table.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pi0 as bp  # noqa: E402

VENV_PYTHON = bp.ROOT / ".venv" / "bin" / "python"


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


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def torch_weight_bytes(model) -> int:
    """Bytes of the model's tensors but the text embedding / LM head; a dynamic-int8 linear's
    packed int8 weight counted at one byte a value."""
    dyn = torch.ao.nn.quantized.dynamic.Linear
    total = 0
    for name, mod in model.named_modules():
        if "embed_tokens" in name or "lm_head" in name:
            continue
        if isinstance(mod, dyn):
            w, b = mod._weight_bias()
            total += w.numel() * w.element_size() + (0 if b is None else b.numel() * b.element_size())
        for t in [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]:
            total += t.numel() * t.element_size()
    return total


def torch_child(args):
    """One torch row in its own process, so /usr/bin/time sees torch's peak RSS alone."""
    torch.set_num_threads(args.threads)
    ck = args.torch_child
    bp.use_shapes("pi0", args.depth)
    import_rss = peak_rss_mb()
    policy = bp.mg.PI0Policy.from_pretrained(ck)  # lerobot's own loader, as a deployment loads it
    policy.eval()
    if args.dyn_int8:
        torch.ao.quantization.quantize_dynamic(policy.model, {torch.nn.Linear}, dtype=torch.qint8,
                                               inplace=True)
        # lerobot reads `linear.weight.dtype` to pick its compute dtype; a dynamic-int8 linear's
        # `weight` is a method, and it takes and gives f32.
        f32 = types.SimpleNamespace(dtype=torch.float32)
        for mod in policy.model.modules():
            if isinstance(mod, torch.ao.nn.quantized.dynamic.Linear):
                object.__setattr__(mod, "weight", f32)
    batch = load_file(str(ck / "inputs.safetensors"))
    # The replaced f32 linears sit in reference cycles until the collector runs, and glibc keeps
    # freed pages: collecting and handing them back lets the runs' peak count what the model holds.
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    # Resetting the high-water mark (Linux clear_refs 5) separates the runs' peak from loading's;
    # it resets the one /usr/bin/time reads too, so loading's peak is kept here.
    load_rss = peak_rss_mb()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        run_rss = None
    except OSError:
        run_rss = float("nan")
    t = bp.torch_times(policy, batch, args.repeat)
    actions = lerobot_actions(policy, batch)
    if run_rss is None:
        run_rss = peak_rss_mb()
    save_file({"actions": actions.contiguous()}, str(args.out))
    weights_mb = torch_weight_bytes(policy) / 2**20
    print(json.dumps({**t, "import_rss_mb": import_rss, "load_rss_mb": load_rss,
                      "run_rss_mb": run_rss, "weights_mb": weights_mb}))


def torch_row(ck: Path, out: Path, args, dyn_int8: bool):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-child", str(ck), "--out", str(out),
           "--depth", str(args.depth), "--threads", str(args.threads), "--repeat", str(args.repeat)]
    run, rss_mb = bp.timed(cmd + (["--dyn-int8"] if dyn_int8 else []))
    r = json.loads(run.stdout.strip().splitlines()[-1])  # lerobot prints its own lines before
    # The child reset its high-water mark after loading: the process's peak is the larger.
    return {**r, "rss_mb": max(rss_mb, r["load_rss_mb"])}, out


def graph_mib(graphs: Path) -> float:
    return sum(f.stat().st_size for f in graphs.iterdir() if f.suffix in (".onnx", ".data")) / 2**20


def why(e: Exception) -> str:
    """The failing step's last words, on one line."""
    if isinstance(e, subprocess.CalledProcessError):
        lines = [ln.strip() for ln in (e.stderr or "").splitlines()
                 if ln.strip() and not ln.startswith(("MAXRSS_KB", "Command exited"))]
        # clap ends with a usage hint: its `error:` line says what was wrong.
        errors = [ln for ln in lines if ln.lower().startswith("error")]
        tool = " ".join(Path(c).name for c in e.cmd[:2])
        return f"{tool} exited {e.returncode}: " + ((errors or lines or ["(no stderr)"])[-1])
    return f"{type(e).__name__}: {e}"


def measure(args, library: Path | None, tmp: Path):
    """Every row's (label, timings with rss_mb, cosine, max err, weights MiB, why it failed)."""
    src = tmp / "f32"
    inputs = src / "inputs.safetensors"
    policy, batch = bp.build("pi0", args.depth, src)
    want = lerobot_actions(policy, batch)
    del policy
    src_weights = resident_bytes(src) / 2**20

    calibration = calibration_inputs(tmp, args.calibration_files)

    # Each row: a function giving (timings with rss_mb, actions file, weights MiB).
    def pi0d(scheme, calibrated=False):
        if scheme == "f32":
            ck = src
        else:
            ck = quantized(src, tmp / f"{scheme}{'-calibrated' * calibrated}", scheme,
                           calibration if calibrated else [])
        return bp.pi0d_times(ck, args.threads, args.repeat), ck / "actions.safetensors", resident_bytes(ck) / 2**20

    def torch_peer(dyn_int8):
        r, out = torch_row(src, tmp / f"torch-{'int8' if dyn_int8 else 'f32'}.safetensors", args, dyn_int8)
        return r, out, r["weights_mb"]

    def ort(name, make):
        if library is None:
            raise RuntimeError("no libonnxruntime: run ./tools/test.sh once (it makes .venv) or pass --onnx-library")
        graphs = tmp / f"ort-{name}"
        make(graphs)
        out = graphs / "actions.safetensors"
        return bp.onnx_run(graphs, inputs, out, args.threads, args.repeat, library), out, graph_mib(graphs)

    def ort_dyn_int8(graphs):
        if not (tmp / "ort-f32" / "manifest.json").exists():
            raise RuntimeError("no f32 graphs to quantize (ort f32 failed)")
        subprocess.run([str(VENV_PYTHON), str(Path(__file__).resolve().parent / "ort_dyn_int8.py"),
                        str(tmp / "ort-f32"), str(graphs)], check=True, capture_output=True, text=True)

    rows = [(f"pi0d {s}", lambda s=s: pi0d(s)) for s in ["f32", "bf16", "w8", "w8a8", "w4"]]
    rows += [(f"pi0d {s} calibrated", lambda s=s: pi0d(s, True)) for s in ["w8", "w8a8", "w4"]]
    rows += [
        ("torch f32", lambda: torch_peer(False)),
        ("torch dyn-int8", lambda: torch_peer(True)),
        ("ort f32", lambda: ort("f32", lambda g: bp.export_graphs(src, g, "--dtype", "f32"))),
        ("ort w8 (DQ+MatMul)", lambda: ort("w8", lambda g: bp.export_graphs(src, g, "--quant", "w8"))),
        ("ort w4 (MatMulNBits)", lambda: ort("w4", lambda g: bp.export_graphs(src, g, "--quant", "w4", "--round-to-nearest"))),
        ("ort dyn-int8", lambda: ort("dyn-int8", ort_dyn_int8)),
    ]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        rows = [(label, fn) for label, fn in rows if label.startswith(tuple(wanted))]
    results = []
    for label, fn in rows:
        print(f"  {label} ...", flush=True, file=sys.stderr)
        try:
            r, actions, weights = fn()
            cos, err = compare(load_file(str(actions))["actions"], want)
            results.append((label, r, cos, err, weights, None))
        except Exception as e:  # a peer that fails gets a row saying why
            results.append((label, None, 0.0, 0.0, 0.0, why(e)))
    return results, src_weights


QUANTIZE_SECONDS: dict[str, float] = {}


def calibration_inputs(tmp: Path, count: int) -> list[Path]:
    """`count` `pi0d infer` inputs files shaped as the measured one, drawn from other seeds."""
    files = []
    for i in range(count):
        gen = torch.Generator().manual_seed(100 + i)
        batch = bp.mg.make_inputs(gen, 2, [], 1, [20 + 3 * i], 48, False)
        path = tmp / f"calibration-{i}.safetensors"
        save_file({k: v.contiguous() for k, v in batch.items()}, str(path))
        files.append(path)
    return files


def quantized(src: Path, out: Path, scheme: str, calibration: list[Path] = ()) -> Path:
    """`src` quantized by `pi0d quantize` into `out` (calibrated on `calibration`, else rounded
    to nearest), with the same inputs file beside it."""
    extra = [a for f in calibration for a in ("--calibration", str(f))]
    if not extra and scheme == "w4":
        extra = ["--round-to-nearest"]
    t = time.perf_counter()
    subprocess.run([str(bp.BIN), "quantize", "--checkpoint", str(src), "--out", str(out),
                    "--scheme", scheme, *extra], check=True, capture_output=True, text=True)
    QUANTIZE_SECONDS[out.name] = time.perf_counter() - t
    shutil.copy(src / "inputs.safetensors", out / "inputs.safetensors")
    return out


def full(args, tmp: Path):
    """The real pi0 at full size (bench_pi0.py --full: lerobot's bf16 mode, random weights), in
    pi0d's schemes: time, accuracy against lerobot's bf16 actions, resident weights, peak RSS."""
    src = tmp / "bf16"
    policy, batch = bp.build_full(src)
    want = lerobot_actions(policy, batch)
    del policy
    rows = []
    calibration = calibration_inputs(tmp, args.calibration_files)
    for scheme in args.schemes.split(","):
        base_scheme, _, calibrated = scheme.partition("-")
        ck = src if scheme == "bf16" else quantized(
            src, tmp / scheme, base_scheme, calibration if calibrated == "calibrated" else [])
        r = bp.pi0d_times(ck, args.threads, args.repeat)
        got = load_file(str(ck / "actions.safetensors"))["actions"]
        cos, err = compare(got, want.float())
        rows.append((scheme, r, cos, err, resident_bytes(ck) / 2**30))
        if ck != src:
            shutil.rmtree(ck)
    base = rows[0][1]["total_ms"]
    print(f"\nreal pi0 (SigLIP 27, Gemma 18, expert 18 layers), random bf16 weights, 2 cameras, 48 tokens, "
          f"{args.threads} threads; actions against lerobot's bf16 (PyTorch CPU)")
    print(f"  {'scheme':16} {'chunk ms':>9} {'x bf16':>7} {'cosine':>9} {'max err':>8} "
          f"{'weights GiB':>12} {'peak RSS GiB':>13} {'RSS/weights':>12}")
    for scheme, r, cos, err, weights in rows:
        rss = r["rss_mb"] / 1024
        print(f"  {scheme:16} {r['total_ms']:9.0f} {r['total_ms'] / base:7.2f} {cos:9.6f} {err:8.1e} "
              f"{weights:12.2f} {rss:13.2f} {rss / weights:12.2f}")
    for name, secs in QUANTIZE_SECONDS.items():
        print(f"  pi0d quantize to {name}: {secs:.0f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true",
                    help="the real pi0 at full size in pi0d's schemes (about 25 GB of disk, 16 GB of memory)")
    ap.add_argument("--workdir", type=Path, default=None, help="where --full writes (default: a temp dir)")
    ap.add_argument("--schemes", default="bf16,w8,w8a8,w4",
                    help="--full: the schemes measured, bf16 (the checkpoint itself) first; "
                         "SCHEME-calibrated for one calibrated on --calibration-files other inputs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--onnx-library", type=Path, default=None)
    ap.add_argument("--bin", type=Path, default=bp.BIN, help="the pi0d to measure (built with --features onnx)")
    ap.add_argument("--calibration-files", type=int, default=2,
                    help="inputs files the calibrated rows are calibrated on (other seeds than the measured one)")
    ap.add_argument("--only", default=None,
                    help="comma-separated row prefixes to measure (pi0d, torch, ort, `ort w4`...); default all")
    # Internal: one torch row, run by main() in a child process.
    ap.add_argument("--torch-child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--dyn-int8", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return
    bp.BIN = args.bin
    if not bp.BIN.exists():
        sys.exit(f"{bp.BIN} missing: run `cargo build --release --features onnx` first")
    if not Path("/usr/bin/time").exists():
        sys.exit("/usr/bin/time missing: apt-get install time")
    library = args.onnx_library or bp.onnx_library()
    torch.set_num_threads(args.threads)
    if args.full:
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            full(args, Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        results, src_weights = measure(args, library, Path(tmp))

    base = next((r["total_ms"] for label, r, *_ in results if label == "pi0d f32" and r), None)
    print(f"\npi0-shaped, depth {args.depth}, 2 cameras, 48 tokens, {args.threads} threads, f32 weights "
          f"{src_weights:.0f} MiB; actions against lerobot's f32 (PyTorch {torch.__version__} CPU)")
    print(f"  {'':24} {'chunk ms':>9} {'x pi0d f32':>10} {'cosine':>9} {'max err':>8} "
          f"{'weights MiB':>12} {'peak RSS MiB':>13} {'RSS/weights':>12}")
    for label, r, cos, err, weights, fail in results:
        if fail:
            print(f"  {label:24} failed: {fail}")
            continue
        ratio = f"{r['total_ms'] / base:10.2f}" if base else f"{'-':>10}"
        print(f"  {label:24} {r['total_ms']:9.1f} {ratio} {cos:9.6f} {err:8.1e} "
              f"{weights:12.0f} {r['rss_mb']:13.0f} {r['rss_mb'] / weights:12.2f}")
    if any(label.startswith("ort") and not fail for label, *_, fail in results):
        print("  ort weights: the graph files, without the last language layer's unused query, output and MLP")
    for label, r, *_, fail in results:
        if not fail and "run_rss_mb" in r:
            print(f"  {label} peak RSS: {r['import_rss_mb']:.0f} MiB with torch and lerobot imported; "
                  f"{r['load_rss_mb']:.0f} MiB up to the model loaded{' and quantized' * ('int8' in label)}; "
                  f"{r['run_rss_mb']:.0f} MiB over the runs alone")
    for name, secs in QUANTIZE_SECONDS.items():
        print(f"  pi0d quantize to {name}: {secs:.0f} s")


if __name__ == "__main__":
    main()
