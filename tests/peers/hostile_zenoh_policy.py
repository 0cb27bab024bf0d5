#!/usr/bin/env python3
"""A hostile policy server on Zenoh (eclipse-zenoh, the same version as pi0d's), for
tests/zenoh_policy.rs. It answers queries on --key with openpi's msgpack-numpy frames, as
`pi0d serve --zenoh` does, but misbehaves as --mode says:

  twice      each query answered twice: first a chunk that holds the arm where the request's
             state is (value = state), then, --gap-s later, one that moves it (state + 0.5)
  value      each query answered once with state + --offset (a second queryable on the key)
  huge       each query answered with --size-mb MB of bytes
  silent     no reply (the query times out)
  error      an error reply

Queryables are declared not complete unless --complete, so a querier's best-matching target
sends each query to every queryable on the key. Prints "ready" once declared; writes the
number of queries it saw to --report at SIGTERM."""

import argparse
import json
import signal
import threading
import time

import numpy as np
import zenoh
from openpi_client import msgpack_numpy

STOP = threading.Event()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--mode", required=True, choices=["twice", "value", "huge", "silent", "error"])
    ap.add_argument("--gap-s", type=float, default=0.0)
    ap.add_argument("--offset", type=float, default=0.0)
    ap.add_argument("--size-mb", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--complete", action="store_true")
    ap.add_argument("--report", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("listen/endpoints", json.dumps([args.listen]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    session = zenoh.open(conf)
    seen = {"queries": 0}
    held = []
    huge = b"\x00" * int(args.size_mb * 1e6) if args.mode == "huge" else b""

    def chunk(state, offset):
        actions = np.tile(state + offset, (args.steps, 1)).astype(np.float32)
        return msgpack_numpy.packb({"actions": actions})

    def on_query(query):
        seen["queries"] += 1
        req = msgpack_numpy.unpackb(query.payload.to_bytes())
        state = np.asarray(req["observation.state"], dtype=np.float64)
        if args.mode == "twice":
            query.reply(query.key_expr, chunk(state, 0.0))
            if args.gap_s > 0:
                time.sleep(args.gap_s)
            query.reply(query.key_expr, chunk(state, 0.5))
        elif args.mode == "value":
            query.reply(query.key_expr, chunk(state, args.offset))
        elif args.mode == "huge":
            query.reply(query.key_expr, huge)
        elif args.mode == "error":
            query.reply_err("refused by the hostile server")
        else:
            # silent: held unanswered (a dropped query would end at once); the querier's
            # timeout ends it.
            held.append(query)

    queryable = session.declare_queryable(args.key, on_query, complete=args.complete)
    print("ready", flush=True)
    STOP.wait()
    del queryable
    if args.report:
        with open(args.report, "w") as f:
            json.dump(seen, f)
    session.close()


if __name__ == "__main__":
    main()
