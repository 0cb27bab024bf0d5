#!/usr/bin/env python3
"""pi0d's CPU inference against lerobot (PyTorch CPU) on the same model, in one run.

    cargo build --release --features onnx
    ~/venvs/golden/bin/python tools/bench_pi0.py [--threads 2] [--depth 1] [--repeat 3]
    ~/venvs/golden/bin/python tools/bench_pi0.py --full [--repeat 1]

`--full` builds the real pi0 with lerobot's own, unpatched configuration (PaliGemma with
SigLIP So400m at 27 layers, Gemma 2B at 18, the Gemma 300M expert at 18, the 257152-token
vocabulary) and random bf16 weights, as lerobot's `dtype="bfloat16"` keeps them (norms and
the vision embedding in f32), and times it in lerobot, in pi0d's native path on the bf16
checkpoint, and as f32 graphs on ONNX Runtime's CPU provider. It needs about 20 GB of memory
and 20 GB of disk under --workdir (the 6.5 GB checkpoint and the 13 GB f32 graphs).

For the tiny test model and a pi0-shaped model (real widths and head sizes: SigLIP 1152 x 4304,
Gemma 2048 x 16384, expert 1024 x 4096, 8 heads / 1 KV head of 256; depth reduced to --depth so
it fits the machine and the time), both with 2 cameras and 48 prompt tokens, it prints the
median time of the prefix, one denoise step and the whole chunk for both, and their ratio
(pi0d / PyTorch: below 1 is faster); the prefix's matmul throughput as a share of the
machine's measured GEMM peak (the faster of PyTorch's f32 matmul of a prefix-MLP shape and
pi0d's kernel on a cache-resident product, `cargo bench --bench matmul -- --peak`); and pi0d's
peak resident memory against the size of the weights.

The same model is also exported with `pi0d export` and run as graphs on ONNX Runtime's CPU
provider (`pi0d infer --backend onnx`, the library from the test venv's onnxruntime wheel or
--onnx-library), printed beside: native CPU against onnx-CPU in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

# lerobot's own model builders, kept before make_golden swaps in its tiny ones.
import lerobot.policies.pi0.modeling_pi0 as _pi0_mod  # noqa: E402

_REAL = {k: getattr(_pi0_mod, k) for k in
         ("get_gemma_config", "PaliGemmaForConditionalGenerationWithPiGemma", "PiGemmaForCausalLM")}

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "pi0d"


def shapes(kind: str, depth: int):
    if kind == "tiny":
        return None
    return dict(
        LM=dict(width=2048, depth=depth, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
        EXPERT=dict(width=1024, depth=depth, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
        VISION=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=depth, num_attention_heads=16),
        ARCH={"vision_heads": 16, "heads": 8, "kv_heads": 1, "head_dim": 256},
    )


def build_full(out: Path):
    """The real pi0 in lerobot's bf16 mode, 2 cameras, 48 prompt tokens (random weights)."""
    for k, v in _REAL.items():
        setattr(mg.pi0_mod, k, v)
    torch.manual_seed(0)
    inputs, outputs = mg.features(2)
    cfg = mg.PI0Config(dtype="bfloat16", device="cpu", input_features=inputs, output_features=outputs)
    t = time.perf_counter()
    policy = mg.PI0Policy(cfg)
    policy.eval()
    print(f"  built the real pi0 in lerobot in {time.perf_counter() - t:.0f} s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    mg.save_model(policy, str(out / "model.safetensors"))
    policy.config._save_pretrained(out)
    # No arch.json: pi0d's defaults are the real pi0's head counts.
    gen = torch.Generator().manual_seed(5)
    batch = mg.make_inputs(gen, 2, [], 1, [20], 48, False)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(out / "inputs.safetensors"))
    return policy, batch


def use_shapes(kind: str, depth: int):
    """Sets make_golden's module shapes so lerobot's classes build `kind` at `depth`."""
    s = shapes(kind, depth)
    if s:
        mg.LM.update(s["LM"])
        mg.EXPERT.update(s["EXPERT"])
        mg.VISION.update(s["VISION"])
        mg.ARCH.clear()
        mg.ARCH.update(s["ARCH"])


def build(kind: str, depth: int, out: Path):
    use_shapes(kind, depth)
    torch.manual_seed(0)
    inputs, outputs = mg.features(2)
    cfg = mg.PI0Config(dtype="float32", device="cpu", input_features=inputs, output_features=outputs)
    policy = mg.PI0Policy(cfg)
    policy.eval()
    out.mkdir(parents=True, exist_ok=True)
    mg.save_model(policy, str(out / "model.safetensors"))
    policy.config._save_pretrained(out)
    (out / "arch.json").write_text(json.dumps(mg.ARCH) + "\n")
    gen = torch.Generator().manual_seed(5)
    batch = mg.make_inputs(gen, 2, [], 1, [20], 48, False)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(out / "inputs.safetensors"))
    return policy, batch


def torch_times(policy, batch, repeat: int):
    m = policy.model
    images = [batch["image0"], batch["image1"]]
    masks = [batch["img_mask0"].bool(), batch["img_mask1"].bool()]
    toks, tmask = batch["lang_tokens"], batch["lang_masks"].bool()

    def prefix():
        embs, pad, att = m.embed_prefix(images, masks, toks, tmask)
        att2 = mg.pi0_mod.make_att_2d_masks(pad, att)
        pos = torch.cumsum(pad, dim=1) - 1
        m.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
        m.paligemma_with_expert.forward(
            attention_mask=mg.pi0_mod.prepare_attention_masks_4d(att2), position_ids=pos,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=True,
        )

    res = {"prefix": [], "total": []}
    with torch.no_grad():
        prefix()  # warm-up
        m.sample_actions(images, masks, toks, tmask, batch["state"], noise=batch["noise"].clone())
        for _ in range(repeat):
            t = time.perf_counter()
            prefix()
            res["prefix"].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            m.sample_actions(images, masks, toks, tmask, batch["state"], noise=batch["noise"].clone())
            res["total"].append((time.perf_counter() - t) * 1e3)
    p, tot = statistics.median(res["prefix"]), statistics.median(res["total"])
    return {"prefix_ms": p, "step_ms": (tot - p) / 10, "total_ms": tot}


def median_times(stdout: str) -> dict:
    """Median prefix / step / chunk of `pi0d infer --repeat` JSON lines, the first (warm-up) dropped."""
    lines = [json.loads(line) for line in stdout.splitlines()][1:]
    p = statistics.median(x["prefix_ms"] for x in lines)
    s = statistics.median(x["steps_ms"] for x in lines)
    return {"prefix_ms": p, "step_ms": s / 10, "total_ms": p + s}


def timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Runs cmd under /usr/bin/time; its output and its peak RSS in MiB."""
    # /usr/bin/time reports the child's own peak RSS (ru_maxrss of a fork from this process
    # would count the Python interpreter's pages before exec).
    run = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB %M", *cmd], capture_output=True, text=True)
    if run.returncode:
        raise subprocess.CalledProcessError(run.returncode, cmd, run.stdout, run.stderr)
    rss_kb = int(run.stderr.split("MAXRSS_KB")[-1].split()[0])
    return run, rss_kb / 1024


def infer_times(args: list[str], threads: int, repeat: int) -> dict:
    """`pi0d infer ARGS` run repeat + 1 times in one process: median times and peak RSS."""
    run, rss_mb = timed([str(BIN), "infer", *args, "--repeat", str(repeat + 1), "--threads", str(threads)])
    return {**median_times(run.stdout), "rss_mb": rss_mb}


def pi0d_times(ck: Path, threads: int, repeat: int):
    return infer_times(["--checkpoint", str(ck), "--inputs", str(ck / "inputs.safetensors"),
                        "--output", str(ck / "actions.safetensors")], threads, repeat)


def onnx_library() -> Path | None:
    for lib in sorted((ROOT / ".venv" / "lib").glob("python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*")):
        return lib
    return None


def export_graphs(ck: Path, out: Path, *extra: str):
    """`pi0d export` of ck as the 2-camera, 48-token graphs the inputs file feeds."""
    subprocess.run(
        [str(BIN), "export", "--checkpoint", str(ck), "--cameras", "2", "--prompt-len", "48",
         "--out", str(out), *extra],
        capture_output=True, text=True, check=True,
    )


def onnx_run(graphs: Path, inputs: Path, output: Path, threads: int, repeat: int, library: Path):
    return infer_times(["--backend", "onnx", "--model-dir", str(graphs), "--onnx-library", str(library),
                        "--inputs", str(inputs), "--output", str(output)], threads, repeat)


def onnx_times(ck: Path, threads: int, repeat: int, library: Path):
    graphs = ck / "graphs"
    export_graphs(ck, graphs, "--dtype", "f32")
    return onnx_run(graphs, ck / "inputs.safetensors", ck / "onnx-actions.safetensors", threads, repeat, library)


def prefix_flops(policy, tokens: int, cameras: int) -> float:
    """Multiply-adds x 2 of the matmuls pi0d's prefix runs (vision, projector, language model)."""
    vc = policy.model.paligemma_with_expert.paligemma.config.vision_config
    tc = policy.model.paligemma_with_expert.paligemma.config.text_config
    n_img = (224 // 14) ** 2
    vw, vm = vc.hidden_size, vc.intermediate_size
    vision = n_img * (3 * 14 * 14 * vw + vc.num_hidden_layers * (4 * vw * vw + 2 * vw * vm + 2 * n_img * vw))
    projector = n_img * vw * tc.hidden_size
    n = cameras * n_img + tokens
    w, m, hd, h = tc.hidden_size, tc.intermediate_size, tc.head_dim, tc.num_attention_heads
    kv = tc.num_key_value_heads
    full = n * (w * h * hd * 2 + 2 * w * kv * hd + 3 * w * m + 2 * n * h * hd)
    # pi0d computes only the keys and values of the last layer (its output is unused).
    lm = (tc.num_hidden_layers - 1) * full + n * 2 * w * kv * hd
    return 2.0 * (cameras * (vision + projector) + lm)


def gemm_peak_gflops(threads: int) -> float:
    a = torch.randn(1024, 2048)
    b = torch.randn(2048, 16384)
    torch.matmul(a, b)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * 1024 * 2048 * 16384 / (time.perf_counter() - t) / 1e9)
    return best


def kernel_peak_gflops(threads: int) -> float:
    """pi0d's own matmul kernel on a cache-resident product (benches/matmul.rs --peak)."""
    # Same features as the binary this script runs: cargo bench rebuilds target/release/pi0d.
    run = subprocess.run(
        ["cargo", "bench", "--quiet", "--features", "onnx", "--bench", "matmul", "--",
         "--peak", "--threads", str(threads)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])["peak_gflops"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["tiny", "pi0"], default=None)
    ap.add_argument("--onnx-library", type=Path, default=None)
    ap.add_argument("--full", action="store_true", help="the real pi0 at full size, bf16 (see above)")
    ap.add_argument("--workdir", type=Path, default=None, help="where --full writes (default: a temp dir)")
    args = ap.parse_args()
    library = args.onnx_library or onnx_library()
    if library is None:
        sys.exit("no libonnxruntime: run ./tools/test.sh once (it makes .venv) or pass --onnx-library")
    if not BIN.exists():
        sys.exit(f"{BIN} missing: run `cargo build --release` first")
    if not Path("/usr/bin/time").exists():
        sys.exit("/usr/bin/time missing: apt-get install time")
    torch.set_num_threads(args.threads)
    torch_peak = gemm_peak_gflops(args.threads)
    kernel_peak = kernel_peak_gflops(args.threads)
    # The machine's measured peak: the faster of PyTorch's GEMM and pi0d's kernel in cache.
    peak = max(torch_peak, kernel_peak)
    print(f"threads {args.threads}; f32 GEMM peak measured: PyTorch {torch.__version__} "
          f"(1024x2048x16384) {torch_peak:.0f} GFLOP/s, pi0d kernel in cache {kernel_peak:.0f} GFLOP/s")
    if args.full:
        full(args, library)
        return
    kinds = [args.only] if args.only else ["tiny", "pi0"]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            ck = Path(tmp) / kind
            policy, batch = build(kind, args.depth, ck)
            weights_mb = (ck / "model.safetensors").stat().st_size / 2**20
            t = torch_times(policy, batch, args.repeat)
            del policy
            r = pi0d_times(ck, args.threads, args.repeat)
            o = onnx_times(ck, args.threads, args.repeat, library)
            label = "tiny" if kind == "tiny" else f"pi0-shaped, depth {args.depth}"
            print(f"\n{label}: 2 cameras, 48 tokens, f32, weights {weights_mb:.0f} MiB")
            print(f"  {'':10} {'PyTorch ms':>12} {'pi0d ms':>10} {'ratio':>7} {'ORT-CPU ms':>11} {'pi0d/ORT':>9}")
            for k in ["prefix_ms", "step_ms", "total_ms"]:
                print(f"  {k[:-3]:10} {t[k]:12.1f} {r[k]:10.1f} {r[k] / t[k]:7.2f} {o[k]:11.1f} {r[k] / o[k]:9.2f}")
            if kind == "pi0":
                pol, _ = build(kind, args.depth, Path(tmp) / "flops")
                gf = prefix_flops(pol, 20, 2) / (r["prefix_ms"] / 1e3) / 1e9
                print(f"  prefix matmuls: {gf:.0f} GFLOP/s = {100 * gf / peak:.0f} % of the measured peak")
            print(f"  pi0d peak RSS {r['rss_mb']:.0f} MiB = {r['rss_mb'] / weights_mb:.2f} x the weights")


def full(args, library: Path):
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        ck = Path(tmp) / "pi0-full"
        policy, batch = build_full(ck)
        weights_mb = (ck / "model.safetensors").stat().st_size / 2**20
        t = torch_times(policy, batch, args.repeat)
        del policy
        r = pi0d_times(ck, args.threads, args.repeat)
        o = onnx_times(ck, args.threads, args.repeat, library)
        print(f"\nreal pi0 (SigLIP 27, Gemma 18, expert 18 layers), bf16 checkpoint {weights_mb:.0f} MiB; "
              "2 cameras, 48 tokens; ONNX Runtime on f32 graphs")
        print(f"  {'':10} {'PyTorch ms':>12} {'pi0d ms':>10} {'ratio':>7} {'ORT-CPU ms':>11} {'pi0d/ORT':>9}")
        for k in ["prefix_ms", "step_ms", "total_ms"]:
            print(f"  {k[:-3]:10} {t[k]:12.1f} {r[k]:10.1f} {r[k] / t[k]:7.2f} {o[k]:11.1f} {r[k] / o[k]:9.2f}")
        print(f"  pi0d peak RSS {r['rss_mb']:.0f} MiB = {r['rss_mb'] / weights_mb:.2f} x the checkpoint")
        horizon = 50 / 50.0
        print(f"  a 50-step chunk at 50 Hz lasts {horizon * 1e3:.0f} ms: pi0d's chunk takes "
              f"{r['total_ms'] / (horizon * 1e3):.1f} x that on this machine")


if __name__ == "__main__":
    main()
