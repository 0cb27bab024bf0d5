#!/usr/bin/env python3
"""A policy server speaking openpi's websocket protocol over TLS (wss://), with openpi-client's
msgpack_numpy and the websockets package: the metadata frame, then for each observation 50
steps holding the observed state. For tests/openpi_client.rs (pi0d's wss:// client)."""

import argparse
import asyncio
import ssl

import numpy as np
import websockets
from openpi_client import msgpack_numpy


async def handler(ws):
    packer = msgpack_numpy.Packer()
    await ws.send(packer.pack({"policy": "tls-test"}))
    async for msg in ws:
        obs = msgpack_numpy.unpackb(msg)
        state = np.asarray(obs["observation.state"], np.float32)
        await ws.send(packer.pack({"actions": np.repeat(state[None], 50, axis=0)}))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    args = ap.parse_args()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    async with websockets.serve(handler, "127.0.0.1", args.port, ssl=ctx, max_size=None):
        print("ready", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
