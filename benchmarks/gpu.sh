#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one command, for a machine whose python already has
# a CUDA build of torch (and transformers, rich, matplotlib, networkx, pytest-xdist and
# pytest-timeout): tests/test_gpu.py, then the head-to-head against torch.compile
# (benchmarks.compiled) on the GPU. Everything lands in OUTDIR: the machine, the test log,
# and the benchmark's log, JSON, page and plots.
#   benchmarks/gpu.sh OUTDIR smoke   the tests, then a small head-to-head (no results)
#   benchmarks/gpu.sh OUTDIR full    the tests, then the head-to-head at the bench sizes
#                                    for MODELS (default: gpt2 resnet50) at torch.compile's
#                                    BUDGETS and memplan's SHARES (default: the benchmark's;
#                                    SHARES= set empty runs none; SKIP names memplan runs to
#                                    leave out: least, matched, below)
# REPLAY, model:budget cases (gpt2:0.2), then runs benchmarks.replay on them too: memplan
# carrying out those torch.compile points' own decisions, bounded by REPLAY_SECONDS.
# TESTS, a pytest -k expression, picks which of tests/test_gpu.py run (default: all).
# TEST_SECONDS and BENCH_SECONDS bound each part, so that a slow part leaves the other its
# time; the benchmark writes its JSON after each run, and each test's result is logged as
# it ends (tests.log), a failure's report too (failures.log), since pytest prints its
# summary only at the end of the run.
set -u
out=${1:?usage: benchmarks/gpu.sh OUTDIR smoke|full}
mode=${2:?usage: benchmarks/gpu.sh OUTDIR smoke|full}
python=${PYTHON:-python3}
# FORCE_COLOR: rich draws its progress bars into the logs too, so a run cut off by its
# time limit still says how far it got.
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 FORCE_COLOR=1 COLUMNS=120
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $python -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  # What the planner charges per transfer for the host calls that start it (docs/gpu.md).
  $python -c 'import torch; from memplan.planner.transfer_cost import transfer_seconds; s = transfer_seconds(torch.device("cuda")); print(f"transfer calls: {s * 1e6:.1f} us")'
  nproc
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

started=$(date +%s)
MEMPLAN_FAILURES_LOG="$out/failures.log" timeout "${TEST_SECONDS:-270}" \
  $python -m pytest tests/test_gpu.py -v -rA --color=no -p no:logging -p no:cacheprovider \
  -n "${WORKERS:-12}" --timeout "${TEST_TIMEOUT:-240}" --durations=0 ${TESTS:+-k "$TESTS"} \
  > "$out/tests.log" 2>&1
echo "tests: exit $? after $(( $(date +%s) - started )) s"
grep -E "^\[gw[0-9]+\] .*(PASSED|FAILED|ERROR|SKIPPED) tests/" "$out/tests.log"  # as each ended
[ -s "$out/failures.log" ] && grep -E "^tests/.*\((setup|call|teardown)\)$" "$out/failures.log"

started=$(date +%s)
if [ "$mode" = smoke ]; then
  set -- --sizes small --models gpt2 resnet50 --budgets 1.0 0.0 --shares 50% --out "$out/smoke"
else
  # shellcheck disable=SC2086  # lists of names and figures
  set -- --models ${MODELS:-gpt2 resnet50} ${BUDGETS:+--budgets $BUDGETS} \
    ${SHARES+--shares $SHARES} ${SKIP:+--skip $SKIP} --out "$out/bench"
fi
timeout "${BENCH_SECONDS:-270}" $python -m benchmarks.compiled --device cuda "$@" \
  > "$out/bench.log" 2>&1
echo "benchmark: exit $? after $(( $(date +%s) - started )) s"
tr '\r' '\n' < "$out/bench.log" | grep -v "━" | tail -n 20
tr '\r' '\n' < "$out/bench.log" | grep "━" | tail -n 1

if [ -n "${REPLAY:-}" ]; then
  started=$(date +%s)
  sizes=bench
  [ "$mode" = smoke ] && sizes=small
  # shellcheck disable=SC2086  # a list of cases
  timeout "${REPLAY_SECONDS:-270}" $python -m benchmarks.replay --device cuda --sizes $sizes \
    --cases $REPLAY --out "$out/replay" > "$out/replay.log" 2>&1
  echo "replay: exit $? after $(( $(date +%s) - started )) s"
  tr '\r' '\n' < "$out/replay.log" | grep -v "━" | tail -n 20
fi
