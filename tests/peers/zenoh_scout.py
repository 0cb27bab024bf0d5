#!/usr/bin/env python3
"""A stranger on the network with Zenoh's default configuration (eclipse-zenoh): scouts by
multicast for --seconds and prints, as JSON, the ids of every Zenoh peer or router that
answered. For tests/zenoh_policy.rs: pi0d's sessions must not be among them unless a setting
opens them."""

import argparse
import json
import threading
import time

import zenoh


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    found = set()
    scout = zenoh.scout(what="peer|router", config=zenoh.Config())
    threading.Thread(target=lambda: (time.sleep(args.seconds), scout.stop()), daemon=True).start()
    for hello in scout:
        found.add(str(hello.zid))
    print(json.dumps(sorted(found)))


if __name__ == "__main__":
    main()
