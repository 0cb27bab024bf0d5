#!/usr/bin/env python3
"""Scrapes a Prometheus endpoint and parses it with Prometheus' own client library
(prometheus_client's OpenMetrics parser, as the endpoint says it speaks): `scrape_metrics.py URL` prints {family: [[sample, labels, value]]}
as JSON; a text the parser refuses fails."""

import json
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    assert r.status == 200, r.status
    assert r.headers["Content-Type"].startswith("application/openmetrics-text"), r.headers["Content-Type"]
    body = r.read().decode()
families = {
    f.name: {"type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
    for f in text_string_to_metric_families(body)
}
print(json.dumps(families))
