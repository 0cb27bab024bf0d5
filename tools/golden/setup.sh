#!/usr/bin/env bash
# Creates the reference environment for tools/make_golden.py (run by hand; CI does not need it:
# the fixtures it writes are committed). Needs python3.12 and PyPI.
set -euo pipefail
venv="${GOLDEN_VENV:-$HOME/venvs/golden}"
# The first python3.12 that runs (a pyenv shim without a selected 3.12 is found but fails).
py=""
for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if "$c" -c "import sys" 2>/dev/null; then py="$c"; break; fi
done
[ -n "$py" ] || { echo "python3.12 not found (install it, or a pyenv 3.12)" >&2; exit 1; }
"$py" -m venv "$venv"
"$venv/bin/pip" install -r "$(dirname "$0")/requirements.txt"
echo "reference environment ready: $venv/bin/python tools/make_golden.py"
