#!/usr/bin/env python3
"""openpi protocol overhead on loopback: pi0d's client against openpi's Python client
(openpi-client), the same server in the same run: openpi's own WebsocketPolicyServer
(openpi-server) with a policy that answers at once (zeros [50, 8]), so what is timed is
encoding, sending, receiving and decoding: 2 cameras at 224x224 uint8, a 7-joint state, a
prompt.

    ./tools/test.sh once (it makes .venv), then:
    .venv/bin/python tools/bench_openpi.py [--n 300] [--cameras 2]
"""

import argparse
import json
import logging
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
from openpi_client import base_policy
from openpi_client import websocket_client_policy as wcp
from openpi_server import WebsocketPolicyServer

ROOT = Path(__file__).resolve().parent.parent


class Instant(base_policy.BasePolicy):
    def infer(self, obs):
        return {"actions": np.zeros((50, 8), np.float32)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--cameras", type=int, default=2)
    args = ap.parse_args()
    port = free_port()
    server = WebsocketPolicyServer(Instant(), host="127.0.0.1", port=port)
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(0.5)

    rng = np.random.default_rng(0)
    obs = {f"observation.images.cam{i}": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
           for i in range(args.cameras)}
    obs["observation/state"] = np.full(7, 0.1, np.float32)
    obs["prompt"] = "pick up the red cube and put it in the bowl"
    client = wcp.WebsocketClientPolicy("127.0.0.1", port)
    for _ in range(10):
        client.infer(obs)
    times = []
    for _ in range(args.n):
        t = time.perf_counter()
        client.infer(obs)
        times.append((time.perf_counter() - t) * 1e3)
    py = {"p50_ms": statistics.median(times), "mean_ms": statistics.fmean(times)}

    run = subprocess.run(
        ["cargo", "bench", "--quiet", "--bench", "openpi_client", "--", "--url",
         f"ws://127.0.0.1:{port}", "--n", str(args.n), "--cameras", str(args.cameras)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    rs = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"openpi round trip on loopback, {args.cameras} cameras 224x224, instant policy "
          f"(openpi-server), {args.n} requests each:")
    print(f"  {'':22} {'p50 ms':>8} {'mean ms':>8}")
    print(f"  {'openpi-client (Python)':22} {py['p50_ms']:8.3f} {py['mean_ms']:8.3f}")
    print(f"  {'pi0d client':22} {rs['p50_ms']:8.3f} {rs['mean_ms']:8.3f}")
    print(f"  pi0d / Python: {rs['p50_ms'] / py['p50_ms']:.2f} (p50), "
          f"{rs['mean_ms'] / py['mean_ms']:.2f} (mean); the server's own time is in both")


if __name__ == "__main__":
    main()
