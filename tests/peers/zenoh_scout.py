#!/usr/bin/env python3
"""A stranger on the network with Zenoh's default configuration (eclipse-zenoh): scouts by
multicast for --seconds and prints, as JSON, the ids of every Zenoh peer or router that
answered. For tests/zenoh_policy.rs: pi0d's sessions must not be among them unless a setting
opens them."""

import argparse
import json
import time

import zenoh


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    found = set()
    # A callback, not an iterator stopped from another thread: the scout ends on this thread.
    scout = zenoh.scout(handler=lambda hello: found.add(str(hello.zid)), what="peer|router",
                        config=zenoh.Config())
    time.sleep(args.seconds)
    scout.stop()
    time.sleep(0.1)
    print(json.dumps(sorted(found)))


if __name__ == "__main__":
    main()
