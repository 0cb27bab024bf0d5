#!/usr/bin/env bash
# Creates the reference environment for tools/make_golden.py (run by hand; CI does not need it:
# the fixtures it writes are committed). Needs python3.12 and PyPI.
set -euo pipefail
venv="${GOLDEN_VENV:-$HOME/venvs/golden}"
py="$(command -v python3.12 || ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 | head -n1)"
"$py" -m venv "$venv"
"$venv/bin/pip" install -r "$(dirname "$0")/requirements.txt"
echo "reference environment ready: $venv/bin/python tools/make_golden.py"
