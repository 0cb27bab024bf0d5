#!/usr/bin/env python3
"""openpi's own client (PyPI openpi-client 0.1.2, unchanged) against `pi0d serve`, plus hostile
requests on raw websockets; writes what it saw as JSON for tests/serve_openpi.rs.

The observation is lerobot's end-to-end fixture (two camera frames, state, task, noise), sent
with the checkpoint's own keys; the Rust test compares the reply with lerobot's actions."""

import argparse
import json
import socket
import struct
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
from openpi_client import msgpack_numpy
from openpi_client import websocket_client_policy as wcp
from websockets.sync.client import connect

DTYPES = {"U8": np.uint8, "F32": np.float32, "I64": np.int64}


def read_safetensors(path: Path) -> dict:
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return out


def raw_ws(url, key, payload, text=False):
    """Sends one frame on a fresh connection; returns what came back (error text, or closed)."""
    try:
        with connect(url, additional_headers={"Authorization": f"Api-Key {key}"},
                     max_size=None, open_timeout=10) as ws:
            ws.recv(timeout=10)  # metadata
            ws.send(payload if not text else payload.decode())
            reply = ws.recv(timeout=30)
            return {"reply": reply if isinstance(reply, str) else f"<{len(reply)} bytes>"}
    except Exception as e:  # closed by the server: the outcome under test
        return {"closed": f"{type(e).__name__}: {e}"[:300]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--case", type=Path, required=True)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--busy", type=int, default=None,
                    help="only send this many requests at once, each on its own connection, "
                         "and report which were answered and which refused")
    ap.add_argument("--keys", default=None,
                    help="JSON {checkpoint key: request key}; then only inference is checked, with "
                         "observation/joint_position added (the server is told to ignore it)")
    ap.add_argument("--processor-case", action="store_true",
                    help="the case is a processor golden (tests/fixtures/processors): its robot camera "
                         "keys, and its real-time chunking leftover when it has one; only inference")
    args = ap.parse_args()
    host, port, url = "127.0.0.1", args.port, f"ws://127.0.0.1:{args.port}"
    report = {}

    with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=10) as r:
        report["healthz"] = [r.status, r.read().decode()]

    try:
        wcp.WebsocketClientPolicy(host, port, api_key="not the key")
        report["wrong_key"] = "connected"
    except Exception as e:
        report["wrong_key"] = f"{type(e).__name__}: {e}"

    # A slow-loris client holds a half-sent request for the whole run.
    loris = socket.create_connection((host, port))
    loris.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")

    raw = read_safetensors(args.case / "raw.safetensors")
    task = json.loads((args.case / "case.json").read_text())["task"]
    obs = {
        "observation.images.cam0": raw["frame0"],
        "observation.images.cam1": raw["frame1"],
        "observation.state": raw["state"],
        "prompt": task,
        "noise": raw["noise"][0],
    }
    if args.processor_case:
        # The robot's own keys (the checkpoint's rename_map maps them), and the running chunk's
        # absolute leftover for a real-time chunking case.
        case = json.loads((args.case / "case.json").read_text())
        obs = {f"observation.images.{c}": raw[f"frame{i}"] for i, c in enumerate(case["cameras"])}
        obs.update({"observation.state": raw["state"], "prompt": task, "noise": raw["noise"][0]})
        if "rtc_leftover" in raw:
            obs["prev_actions"] = raw["rtc_leftover"]
            obs["inference_delay"] = case["rtc_inference_delay"]
            obs["execution_horizon"] = case["rtc_execution_horizon"]
        policy = wcp.WebsocketClientPolicy(host, port, api_key=args.key)
        report["metadata"] = policy.get_server_metadata()
        report["actions"] = policy.infer(obs)["actions"].tolist()
        loris.close()
        args.report.write_text(json.dumps(report))
        return
    if args.busy:
        import threading
        clients = [wcp.WebsocketClientPolicy(host, port, api_key=args.key) for _ in range(args.busy)]
        outcomes = [None] * args.busy

        def ask(i):
            try:
                clients[i].infer(obs)
                outcomes[i] = "answered"
            except RuntimeError as e:
                outcomes[i] = str(e)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(args.busy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report["outcomes"] = outcomes
        # Still serving afterwards.
        report["after"] = wcp.WebsocketClientPolicy(host, port, api_key=args.key).infer(obs)["actions"].shape[0]
        loris.close()
        args.report.write_text(json.dumps(report))
        return
    if args.keys:
        renames = json.loads(args.keys)
        obs = {renames.get(k, k): v for k, v in obs.items()}
        if renames:
            obs["observation/joint_position"] = np.zeros(7)
        policy = wcp.WebsocketClientPolicy(host, port, api_key=args.key)
        report["metadata"] = policy.get_server_metadata()
        report["actions"] = policy.infer(obs)["actions"].tolist()
        loris.close()
        args.report.write_text(json.dumps(report))
        return
    policy = wcp.WebsocketClientPolicy(host, port, api_key=args.key)
    report["metadata"] = policy.get_server_metadata()
    first = policy.infer(obs)
    report["actions"] = first["actions"].tolist()
    report["actions_dtype"] = str(first["actions"].dtype)
    report["first_timing"] = first["server_timing"]
    second = policy.infer(obs)
    report["second_timing"] = second["server_timing"]
    report["policy_timing"] = second["policy_timing"]
    report["same_again"] = bool(np.array_equal(first["actions"], second["actions"]))

    # Four clients at once, each with its own noise: the server batches those waiting, and each
    # reply must be that client's own (as answered alone).
    import threading

    def noisy(i):
        o = dict(obs)
        o["noise"] = (raw["noise"][0] * (1.0 + 0.1 * i)).astype(np.float32)
        return o

    alone = [policy.infer(noisy(i))["actions"] for i in range(4)]
    clients = [wcp.WebsocketClientPolicy(host, port, api_key=args.key) for _ in range(4)]
    together = [None] * 4

    def ask(i):
        together[i] = clients[i].infer(noisy(i))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report["concurrent_max_diff"] = max(float(np.abs(a - t["actions"]).max()) for a, t in zip(alone, together))
    report["concurrent_batches"] = [int(t["policy_timing"]["batch"]) for t in together]
    report["distinct_replies"] = len({t["actions"].tobytes() for t in together})

    bad = dict(obs)
    del bad["observation.state"]
    try:
        policy.infer(bad)
        report["error"] = None
    except RuntimeError as e:
        report["error"] = str(e)

    pack = msgpack_numpy.packb
    deep = {"prompt": task}
    nested = 1
    for _ in range(200):
        nested = [nested]
    deep["nested"] = nested
    absurd = dict(obs)
    absurd["observation.state"] = {b"__ndarray__": True, b"data": b"\0" * 28, b"dtype": "<f4",
                                   b"shape": [2 ** 40, 2 ** 40]}
    wrong_dtype = dict(obs)
    wrong_dtype["observation.images.cam0"] = raw["frame0"].astype(np.float64)
    report["hostile"] = {
        "oversized": raw_ws(url, args.key, b"\x80" + b"\0" * (2 * 1024 * 1024)),
        "deep": raw_ws(url, args.key, pack(deep)),
        "absurd_shape": raw_ws(url, args.key, msgpack.packb(absurd, default=msgpack_numpy.pack_array)),
        "wrong_dtype": raw_ws(url, args.key, pack(wrong_dtype)),
        "garbage": raw_ws(url, args.key, b"\xdb\xff\xff\xff\xffabc"),  # a 4 GB string, 3 bytes given
        "text": raw_ws(url, args.key, b"hello", text=True),
    }

    # The server kept serving: a fresh well-behaved client is answered.
    again = wcp.WebsocketClientPolicy(host, port, api_key=args.key)
    t = time.time()
    report["after_hostile"] = again.infer(obs)["actions"].tolist() == report["actions"]
    report["after_hostile_s"] = time.time() - t
    loris.close()
    args.report.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
