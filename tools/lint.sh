#!/usr/bin/env bash
# The lints to run before committing: formatting, then clippy (warnings denied) on every target
# with every feature, and again with default features on the code that differs (the library,
# also in test mode, binaries, benches and examples: code behind a feature can leave an import
# or a helper unused without it). The test command lints with every feature only.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo clippy --workspace --lib --bins --benches --examples --locked -- -D warnings
cargo clippy --workspace --lib --profile test --locked -- -D warnings
echo "lint: clean"
