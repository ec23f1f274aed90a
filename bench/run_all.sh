#!/usr/bin/env bash
# Every benchmark in one budget-aware pass, then one table (bench/results/SUMMARY.md).
#
# A step runs in full when its full estimate still leaves room for the quick estimates of the
# steps after it within BENCH_BUDGET seconds (default 540: `make bench` stays under 10 min);
# otherwise quick. BENCH_MODE=quick|full forces a mode. Each step has a hard timeout (SIGINT
# first, so its cleanup runs); a failed step is reported, its results marked stale or
# "not run", and the run exits 1 after printing the table.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUDGET=${BENCH_BUDGET:-540}
MODE=${BENCH_MODE:-auto}
RESULTS=bench/results
mkdir -p "$RESULTS"
LOGS=$(mktemp -d -t sessionstream-bench.XXXXXX)
START=$(date +%s)

# name | full estimate s | quick estimate s | full command | quick command
STEPS=(
  "decider|15|6|-m bench.bench_decider --json|-m bench.bench_decider --json --commands 20000"
  "processor|130|45|-m bench.bench_processor --save|-m bench.bench_processor --quick --save"
  "sink|330|60|-m bench.bench_sink --save|-m bench.bench_sink --quick --save"
  "worker|75|45|-m bench.bench_worker|-m bench.bench_worker --cancels 15 --takeovers 2"
  "baselines|90|60|-m bench.bench_baselines|-m bench.bench_baselines --quick"
  "sweep|160|100|-m bench.bench_sweep|-m bench.bench_sweep --quick"
  "gateway-abuse|75|55|-m bench.bench_gateway_abuse|-m bench.bench_gateway_abuse --tries 5 --streams 100"
)
# BENCH_PEERS=1: Restate and Temporal beside us too (past the 10 min budget; installs on first use)
if [[ ${BENCH_PEERS:-0} == 1 ]]; then
  STEPS+=("peers|420|200|-m bench.peers|-m bench.peers --quick")
fi

failed=()
records=()
for i in "${!STEPS[@]}"; do
  IFS='|' read -r name full quick full_cmd quick_cmd <<<"${STEPS[$i]}"
  elapsed=$(($(date +%s) - START))
  later=0
  for j in "${!STEPS[@]}"; do
    if ((j > i)); then
      later=$((later + $(cut -d'|' -f3 <<<"${STEPS[$j]}")))
    fi
  done
  mode=$MODE
  if [[ $mode == auto ]]; then
    if ((elapsed + full + later <= BUDGET)); then mode=full; else mode=quick; fi
  fi
  if [[ $mode == full ]]; then cmd=$full_cmd est=$full; else cmd=$quick_cmd est=$quick; fi
  echo "== $name ($mode, ~${est} s; ${elapsed} s elapsed of ${BUDGET}): $cmd"
  t0=$(date +%s)
  load=$(cut -d' ' -f1 /proc/loadavg)
  status=ok
  # shellcheck disable=SC2086  # the command is a word list on purpose
  if [[ $name == decider ]]; then
    # the decider bench prints its JSON instead of writing a file
    if timeout --signal=INT --kill-after=20 $((est * 2 + 30)) "$PY" $cmd >"$RESULTS/.decider.tmp" 2>"$LOGS/$name.log"; then
      mv "$RESULTS/.decider.tmp" "$RESULTS/decider.json"
      cat "$RESULTS/decider.json"
    else
      status=failed
    fi
  elif ! timeout --signal=INT --kill-after=20 $((est * 2 + 30)) "$PY" $cmd >"$LOGS/$name.log" 2>&1; then
    status=failed
  fi
  secs=$(($(date +%s) - t0))
  if [[ $status == failed ]]; then
    failed+=("$name")
    echo "!! $name failed after ${secs} s; its output: $LOGS/$name.log" >&2
    tail -n 25 "$LOGS/$name.log" >&2 2>/dev/null || true
  else
    echo "   done in ${secs} s"
  fi
  records+=("{\"name\": \"$name\", \"mode\": \"$mode\", \"status\": \"$status\", \"seconds\": $secs, \"loadavg_start\": $load}")
done
rm -f "$RESULTS/.decider.tmp"

wall=$(($(date +%s) - START))
joined=$(IFS=,; echo "${records[*]}")
printf '{"started": %s, "wall_seconds": %s, "budget_seconds": %s, "steps": [%s]}\n' \
  "$START" "$wall" "$BUDGET" "$joined" >"$RESULTS/run_all.json"
echo
"$PY" -m bench.summarize --since "$START" --wall "$wall"
if ((${#failed[@]})); then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
