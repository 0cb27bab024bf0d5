#!/usr/bin/env bash
# The project venv (.venv) with the interop tests' independent peers (Cyclone DDS, rosbags,
# MuJoCo, ...), pinned in tests/peers/requirements*.txt. Reinstalled whenever the requirements
# change (their hash is kept in the venv). Used by tools/test.sh and tools/hil_demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
want="$(cat tests/peers/requirements.txt tests/peers/requirements-nodeps.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.requirements-sha 2>/dev/null)" != "$want" ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/peers/requirements.txt
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r tests/peers/requirements-nodeps.txt
  echo "$want" > .venv/.requirements-sha
fi
