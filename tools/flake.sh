#!/usr/bin/env bash
# Runs the timing-sensitive test binaries N times with K busy loops beside them and prints each
# test's pass rate; exits non-zero if any test passed fewer than N of N.
#
#   tools/flake.sh [-n RUNS] [-k BUSY_LOOPS] [-f REGEX] [-- TEST_FILTER...]
#
#   -n RUNS        runs of each binary (default 10)
#   -k BUSY_LOOPS  `yes > /dev/null` loops beside the tests (default 2)
#   -f REGEX       only the binaries whose name matches (default: all timing-sensitive ones)
#   TEST_FILTER    passed to each binary (libtest's name filter)
#
# Builds once with the flags of tools/test.sh (--workspace --all-features --locked), then runs
# the built binaries directly. A test passes only if it passed in every run.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10 busy=2 only=""
while getopts "n:k:f:h" opt; do
  case "$opt" in
    n) runs=$OPTARG ;;
    k) busy=$OPTARG ;;
    f) only=$OPTARG ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "flake.sh: -n wants a count >= 1, got '$runs'" >&2; exit 2; }
[[ "$busy" =~ ^[0-9]+$ ]] || { echo "flake.sh: -k wants a count >= 0, got '$busy'" >&2; exit 2; }

# The binaries whose tests judge a running daemon (watchdogs, control rate, reactions). `it`
# holds tests/it/ (reload, record_mcap, fault_latch and the other in-process and short-run
# files; the tick-by-tick watchdog and reload-safety tests, in synthetic time, are unit tests):
# pass a TEST_FILTER (e.g. `fault_latch::`) to run part of it.
timing=(hil hil_task scenarios exit_codes edges ros_interop zenoh_interop zenoh_policy it
        systemd_notify ur5e config_fuzz openpi_client openpi_hostile serve_openpi
        serve_hostile journald)
selected=()
for b in "${timing[@]}"; do
  if [[ -z "$only" || "$b" =~ $only ]]; then selected+=("$b"); fi
done
[[ ${#selected[@]} -gt 0 ]] || { echo "flake.sh: no binary matches -f '$only'" >&2; exit 2; }

export CARGO_TERM_COLOR=never
flags=(--workspace --all-features --locked)
targets=()
for b in "${selected[@]}"; do targets+=(--test "$b"); done
echo "== building ${selected[*]}"
cargo test "${flags[@]}" --no-run "${targets[@]}"
# The executables, from cargo's own report (each test target's "executable").
declare -A exe
while IFS=$'\t' read -r name path; do
  exe[$name]=$path
done < <(cargo test "${flags[@]}" --no-run "${targets[@]}" --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in t.get("kind", []):
        print(t["name"] + "\t" + m["executable"])
')

busy_pids=()
cleanup() {
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${busy_pids[@]}" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
for _ in $(seq 1 "$busy"); do
  yes > /dev/null &
  busy_pids+=($!)
done
echo "== $runs run(s) of each with $busy busy loop(s) beside them"

declare -A passed seen
logs=$(mktemp -d "${TMPDIR:-/tmp}/flake-logs.XXXXXX")
for run in $(seq 1 "$runs"); do
  for b in "${selected[@]}"; do
    bin=${exe[$b]:-}
    [[ -n "$bin" ]] || { echo "flake.sh: cargo built no executable for $b" >&2; exit 2; }
    log="$logs/$b.$run.log"
    # The tests' own verdicts, one line each ("test NAME ... ok|FAILED|ignored").
    (cd "$PWD" && "$bin" --test-threads=1 "$@" > "$log" 2>&1) || true
    while read -r _ name _ verdict; do
      case "$verdict" in
        ok) seen["$b::$name"]=$((${seen["$b::$name"]:-0} + 1))
            passed["$b::$name"]=$((${passed["$b::$name"]:-0} + 1)) ;;
        FAILED) seen["$b::$name"]=$((${seen["$b::$name"]:-0} + 1))
                passed["$b::$name"]=${passed["$b::$name"]:-0}
                echo "   $b::$name FAILED in run $run (log: $log)" ;;
      esac
    done < <(grep -E '^test .* \.\.\. (ok|FAILED)$' "$log")
    # A binary that ran no test at all (crashed before, or the filter matched nothing here).
    grep -qE '^test result:' "$log" || echo "   $b: no result in run $run (log: $log)"
  done
  echo "   run $run of $runs done"
done

echo
printf '%-110s %s\n' "test" "passed/runs"
bad=0
for t in $(printf '%s\n' "${!seen[@]}" | sort); do
  p=${passed[$t]:-0}
  printf '%-110s %s/%s\n' "$t" "$p" "$runs"
  [[ "$p" -eq "$runs" && "${seen[$t]}" -eq "$runs" ]] || bad=1
done
[[ ${#seen[@]} -gt 0 ]] || { echo "flake.sh: no test ran" >&2; exit 1; }
if [[ $bad -ne 0 ]]; then
  echo "flake.sh: some test passed fewer than $runs of $runs (logs in $logs)" >&2
  exit 1
fi
rm -rf "$logs"
echo "flake.sh: every test passed $runs of $runs with $busy busy loop(s)"
