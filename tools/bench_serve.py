#!/usr/bin/env python3
"""Serving throughput and latency, `pi0d serve` against openpi's own server (openpi-server)
serving lerobot's pi0 on the same checkpoint with the same thread count, in one run: 1 and 4
clients (openpi-client, each in its own process), each sending the same observation over and
over for --seconds; `pi0d serve` batching concurrent requests (default) and one at a time
(`--max-batch 1`). Prints requests per second and latency p50 / p99 per server and client
count, and the ratios.

    cargo build --release
    tools/golden/setup.sh   # lerobot 0.6.1, torch
    ~/venvs/golden/bin/pip install --no-deps openpi-client==0.1.2 openpi-server==0.1.0 msgpack websockets dm-tree
    ~/venvs/golden/bin/python tools/bench_serve.py [--threads 2] [--seconds 10]
"""

import argparse
import multiprocessing as mp
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CK = ROOT / "models" / "tiny-pi0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_lerobot(port: int, threads: int):
    """openpi-server's WebsocketPolicyServer around lerobot's PI0Policy and processors."""
    import logging

    import torch
    from openpi_client import base_policy
    from openpi_server import WebsocketPolicyServer
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(ROOT / "tools"))
    import make_golden as mg  # lerobot's classes at the tiny model's sizes
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    torch.set_num_threads(threads)
    policy = mg.PI0Policy.from_pretrained(str(CK))
    policy.eval()
    fast = PreTrainedTokenizerFast(tokenizer_file=str(CK / "tokenizer.json"), pad_token="<pad>",
                                   eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
    pre = PolicyProcessorPipeline.from_pretrained(str(CK), config_filename="policy_preprocessor.json",
                                                  overrides={"tokenizer_processor": {"tokenizer": fast}})
    post = PolicyProcessorPipeline.from_pretrained(str(CK), config_filename="policy_postprocessor.json",
                                                   to_transition=policy_action_to_transition,
                                                   to_output=transition_to_policy_action)

    class Lerobot(base_policy.BasePolicy):
        def infer(self, obs):
            img = torch.from_numpy(obs["observation.images.front"]).permute(2, 0, 1)[None].float() / 255.0
            batch = {"observation.images.front": img,
                     "observation.state": torch.from_numpy(np.asarray(obs["observation.state"], np.float32))[None],
                     "task": obs["prompt"]}
            with torch.no_grad():
                actions = post(policy.predict_action_chunk(pre(batch)))
            return {"actions": actions[0].numpy()}

    server = WebsocketPolicyServer(Lerobot(), host="127.0.0.1", port=port)
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    print("ready", flush=True)
    server.serve_forever()


def client(port: int, seconds: float, start: float, out):
    from openpi_client import websocket_client_policy as wcp

    rng = np.random.default_rng(port)
    obs = {"observation.images.front": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
           "observation.state": np.zeros(7, np.float32), "prompt": "pick up the red cube and put it in the bowl"}
    c = wcp.WebsocketClientPolicy("127.0.0.1", port)
    c.infer(obs)  # warm-up
    while time.time() < start:
        time.sleep(0.001)
    lat = []
    while time.time() < start + seconds:
        t = time.perf_counter()
        c.infer(obs)
        lat.append((time.perf_counter() - t) * 1e3)
    out.put(lat)


def load(port: int, clients: int, seconds: float):
    q = mp.Queue()
    start = time.time() + 2.0
    procs = [mp.Process(target=client, args=(port, seconds, start, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    lat = [x for _ in procs for x in q.get()]
    for p in procs:
        p.join()
    lat.sort()
    return {"rps": len(lat) / seconds, "p50": statistics.median(lat), "p99": lat[int(0.99 * (len(lat) - 1))]}


def wait_ready(port: int):
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"no server on {port}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve-lerobot", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_lerobot:
        serve_lerobot(args.serve_lerobot, args.threads)
        return
    binary = ROOT / "target" / "release" / "pi0d"
    if not binary.exists():
        sys.exit("cargo build --release first")
    results = {}
    for name in ["pi0d serve", "pi0d serve --max-batch 1", "openpi-server + lerobot"]:
        port = free_port()
        if name.startswith("pi0d serve"):
            cmd = [str(binary), "serve", "--checkpoint", str(CK), "--threads", str(args.threads),
                   "--listen", f"127.0.0.1:{port}"] + name.split()[2:]
        else:
            cmd = [sys.executable, __file__, "--serve-lerobot", str(port), "--threads", str(args.threads)]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port)
            for n in (1, 4):
                results[(name, n)] = load(port, n, args.seconds)
        finally:
            server.terminate()
            server.wait()
    print(f"tiny pi0 ({CK.name}), 1 camera 224x224, {args.threads} threads, {args.seconds:.0f} s per run:")
    print(f"  {'server':26} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for (name, n), r in results.items():
        print(f"  {name:26} {n:7d} {r['rps']:8.1f} {r['p50']:8.1f} {r['p99']:8.1f}")
    for n in (1, 4):
        a, b = results[("pi0d serve", n)], results[("openpi-server + lerobot", n)]
        print(f"  {n} client(s): pi0d serves {a['rps'] / b['rps']:.2f}x the requests per second")
    b4, u4 = results[("pi0d serve", 4)], results[("pi0d serve --max-batch 1", 4)]
    print(f"  batching 4 clients: {b4['rps'] / u4['rps']:.2f}x the requests per second of one at a time")


if __name__ == "__main__":
    main()
