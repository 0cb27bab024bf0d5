#!/usr/bin/env python3
"""The metrics endpoint's scrape time under idle connections: `pi0d run` on the simulated arm
with `[metrics]`, scraped --scrapes times alone, then with --idle connections held open that
never send a byte (as a port scanner or a stuck client leaves them). Prints the scrape's p50
and max in both cases and their ratio. Only Python's standard library.

    cargo build --release
    python3 tools/bench_metrics.py [--idle 20] [--scrapes 50]
"""

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """One whole scrape (connect, request, read to the end): seconds taken."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: pi0d\r\n\r\n")
        body = b""
        while chunk := s.recv(65536):
            body += chunk
    took = time.perf_counter() - t0
    assert body.startswith(b"HTTP/1.1 200 OK"), body[:80]
    return took


def figures(port, n):
    times = sorted(scrape(port) for _ in range(n))
    return statistics.median(times), times[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=20)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "pi0d"))
    args = ap.parse_args()
    port = free_port()
    cfg = (ROOT / "config" / "sim.toml").read_text()
    # Paths in sim.toml are relative to its directory: the copy lives beside it.
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=ROOT / "config", delete=True) as f:
        f.write(cfg + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        f.flush()
        run = subprocess.Popen(
            [args.binary, "run", "--quiet", "--config", f.name, "--duration", "600"],
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 60
            while True:
                try:
                    scrape(port)
                    break
                except OSError:
                    if time.time() > deadline or run.poll() is not None:
                        sys.exit("pi0d did not serve its metrics")
                    time.sleep(0.2)
            alone = figures(port, args.scrapes)
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.idle)]
            held = figures(port, args.scrapes)
            for s in idle:
                s.close()
        finally:
            run.terminate()
            run.wait(timeout=30)
    print(f"scrape alone: p50 {alone[0] * 1e3:.2f} ms, max {alone[1] * 1e3:.2f} ms")
    print(
        f"scrape with {args.idle} idle connections held: p50 {held[0] * 1e3:.2f} ms, "
        f"max {held[1] * 1e3:.2f} ms (p50 x{held[0] / alone[0]:.2f} of alone)"
    )


if __name__ == "__main__":
    main()
