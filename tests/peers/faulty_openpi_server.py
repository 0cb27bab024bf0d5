#!/usr/bin/env python3
"""openpi's own policy server (PyPI openpi-server 0.1.0, WebsocketPolicyServer, unchanged)
serving a policy that drives the arm smoothly around where it is, with faults scheduled by
request number, for tests/openpi_client.rs. It checks what pi0d's client sends (openpi's key
layout, uint8 HWC images at the server's size, the state, the prompt, the extra keys) and
writes what it saw as JSON when it gets SIGTERM.

Faults (--faults "6:error,7:error,8:nan,..."): error (an exception: openpi's server sends the
traceback and closes with 1011), nan (NaN actions), shape (a 1-D `actions`), close (the
connection closes with no reply), stall (no reply for --stall-s, longer than the client's
timeout). Replies are [50, 8]: one column more than the arm's 7, as padded models return."""

import argparse
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import websockets
from openpi_client import base_policy
from openpi_server import WebsocketPolicyServer

EXPECTED = {"observation/image": ((224, 224, 3), np.uint8), "observation/state": ((7,), np.float32)}


class FaultyPolicy(base_policy.BasePolicy):
    def __init__(self, faults, stall_s):
        self.faults, self.stall_s = faults, stall_s
        self.n = 0
        self.seen = {"requests": 0, "normal": 0, "faults": {}, "bad_requests": [], "prompts": set(),
                     "extra": None, "normal_after_faults": 0}
        self.t0 = time.time()

    def infer(self, obs):
        self.n += 1
        s = self.seen
        s["requests"] += 1
        for k, (shape, dtype) in EXPECTED.items():
            v = obs.get(k)
            if not isinstance(v, np.ndarray) or v.shape != shape or v.dtype != dtype:
                s["bad_requests"].append(f"{k}: {getattr(v, 'shape', None)} {getattr(v, 'dtype', type(v))}")
        s["prompts"].add(obs.get("prompt"))
        s["extra"] = obs.get("observation/flag")
        fault = self.faults.get(self.n)
        state = np.asarray(obs["observation/state"], dtype=np.float64)
        now = time.time() - self.t0
        t = now + 0.02 * np.arange(50)
        wave = 0.05 * np.sin(2 * math.pi * 0.5 * t)
        actions = np.repeat(state[None, :], 50, axis=0)
        actions[:, :6] += wave[:, None]
        actions = np.concatenate([actions, np.full((50, 1), 99.0)], axis=1).astype(np.float32)
        if fault:
            s["faults"][fault] = s["faults"].get(fault, 0) + 1
        if fault == "error":
            raise ValueError("the model is not loaded")
        if fault == "close":
            raise websockets.ConnectionClosed(None, None)
        if fault == "stall":
            time.sleep(self.stall_s)
        if fault == "nan":
            actions[10:, 2] = np.nan
        if fault == "shape":
            return {"actions": actions[:, 0]}
        if not fault:
            s["normal"] += 1
            if self.n > max(self.faults, default=0):
                s["normal_after_faults"] += 1
        return {"actions": actions}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--faults", default="")
    ap.add_argument("--stall-s", type=float, default=2.5)
    args = ap.parse_args()
    faults = {}
    for item in filter(None, args.faults.split(",")):
        n, kind = item.split(":")
        faults[int(n)] = kind
    policy = FaultyPolicy(faults, args.stall_s)
    server = WebsocketPolicyServer(policy, host="127.0.0.1", port=args.port,
                                   metadata={"policy": "test", "action_horizon": 50})

    def done(*_):
        s = dict(policy.seen)
        s["prompts"] = sorted(p for p in s["prompts"] if p is not None)
        args.report.write_text(json.dumps(s))
        sys.stdout.flush()
        # The server runs forever on asyncio: leave without unwinding it.
        import os
        os._exit(0)

    signal.signal(signal.SIGTERM, done)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
