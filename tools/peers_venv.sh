#!/usr/bin/env bash
# The project venv (.venv) with the interop tests' independent peers (Cyclone DDS, rosbags,
# MuJoCo, ...), pinned in tests/peers/requirements*.txt. Reinstalled whenever the requirements
# change (their hash is kept in the venv). Used by tools/test.sh and tools/hil_demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
want="$(cat tests/peers/requirements.txt tests/peers/requirements-nodeps.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.requirements-sha 2>/dev/null)" != "$want" ]; then
  echo "installing the pinned test peers into .venv (about 600 MB; pip's cache is kept)"
  python3 -m venv .venv
  # Wheels only: every pin has one, and a missing wheel is an error here rather than a long
  # source build. Every version is pinned, so the resolver has nothing to backtrack over.
  pip=(.venv/bin/pip install --quiet --disable-pip-version-check --no-input --progress-bar off
    --only-binary=:all:)
  "${pip[@]}" -r tests/peers/requirements.txt
  "${pip[@]}" --no-deps -r tests/peers/requirements-nodeps.txt
  echo "$want" > .venv/.requirements-sha
else
  echo ".venv is up to date with tests/peers/requirements*.txt"
fi
