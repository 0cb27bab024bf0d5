#!/usr/bin/env python3
"""openpi protocol overhead on loopback: pi0d's client against openpi's Python client
(openpi-client), the same server in the same run: openpi's own WebsocketPolicyServer
(openpi-server) with a policy that answers at once (zeros [50, 8]), so what is timed is
encoding, sending, receiving and decoding: 2 cameras at 224x224 uint8, a 7-joint state, a
prompt.

    ./tools/test.sh once (it makes .venv), then:
    .venv/bin/python tools/bench_openpi.py [--n 300] [--cameras 2] [--rounds 5]
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
from openpi_client import msgpack_numpy
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
    ap.add_argument("--rounds", type=int, default=5)
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

    def python_p50():
        times = []
        for _ in range(args.n):
            t = time.perf_counter()
            client.infer(obs)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    def pi0d_p50():
        run = subprocess.run(
            ["cargo", "bench", "--quiet", "--bench", "openpi_client", "--", "--url",
             f"ws://127.0.0.1:{port}", "--n", str(args.n), "--cameras", str(args.cameras)],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )
        out = json.loads(run.stdout.strip().splitlines()[-1])
        codec_rs.append(out["codec_p50_ms"])
        return out["p50_ms"]

    # The clients' own work apart from the network and the server: openpi-client packs the
    # observation and unpacks a reply like the server's.
    reply = msgpack_numpy.Packer().pack({"actions": np.zeros((50, 8), np.float32),
                                         "server_timing": {"infer_ms": 0.01}})
    packer = msgpack_numpy.Packer()

    def python_codec_p50():
        times = []
        for _ in range(args.n):
            t = time.perf_counter()
            packer.pack(obs)
            msgpack_numpy.unpackb(reply)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    codec_rs, codec_py = [], []

    # Interleaved rounds: the machine's drift hits both alike.
    py, rs = [], []
    for _ in range(args.rounds):
        py.append(python_p50())
        codec_py.append(python_codec_p50())
        rs.append(pi0d_p50())
    p, r = statistics.median(py), statistics.median(rs)
    print(f"openpi round trip on loopback, {args.cameras} cameras 224x224, instant policy "
          f"(openpi-server), {args.rounds} interleaved rounds of {args.n} requests; p50 per round, ms:")
    print(f"  openpi-client (Python): {' '.join(f'{x:.3f}' for x in py)}  median {p:.3f}")
    print(f"  pi0d client:            {' '.join(f'{x:.3f}' for x in rs)}  median {r:.3f}")
    print(f"  pi0d / Python: {r / p:.2f} (the server's own decoding and encoding are in both)")
    cp, cr = statistics.median(codec_py), statistics.median(codec_rs)
    print(f"client encode + decode alone, p50 ms: openpi-client {cp:.3f}, pi0d {cr:.3f}: "
          f"pi0d / Python {cr / cp:.2f}")


if __name__ == "__main__":
    main()
