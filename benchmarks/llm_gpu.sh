#!/usr/bin/env bash
# Issue 72's campaign in one command, for a machine with one CUDA GPU whose python already
# has a CUDA build of torch and transformers: benchmarks.llm_gpu at its gpu size (a
# 4-layer Llama-3.2-1B-shaped decoder at 4,096 tokens, the batch chosen from the GPU's
# memory), each method in a process of its own, within about nine minutes in all.
#   benchmarks/llm_gpu.sh OUTDIR [benchmarks.llm_gpu options: --layers 6, --batch 8, ...]
# Everything lands in OUTDIR: machine.txt, the campaign's log (llm_gpu.log), each
# method's log (logs/), llm-gpu.json (written after each method, so that a run cut off
# keeps what it measured), the fit's plan, and the page section and plot (docs/). Back in
# the repository: copy llm-gpu.json into benchmarks/results/, then `python -m
# benchmarks.llm_gpu --report-only benchmarks/results/llm-gpu.json` writes them into docs/.
# TIME_LIMIT bounds the methods (510 s unless set: each is also bounded on its own, the
# most important run first); TOTAL_SECONDS bounds the whole command (570 s unless set).
set -u
out=${1:?usage: benchmarks/llm_gpu.sh OUTDIR [benchmarks.llm_gpu options]}
shift
python=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=120
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"

# What the campaign imports (torch, transformers, and memplan's own needs: OR-Tools for
# the layout), then what memplan has but this campaign does not use (the milp solver,
# the literature's graphs): each one that does not import is named.
not_importing() {
  $python -c 'import importlib, sys
def imports(name):
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True
print(" ".join(name for name in sys.argv[1:] if not imports(name)))' "$@"
}
missing=$(not_importing torch transformers ortools rich matplotlib numpy)
unused=$(not_importing pulp highspy networkx)
[ -n "$unused" ] && echo "missing, not needed here: $unused"
if [ -n "$missing" ]; then
  echo "missing python packages: $missing; install them and run again"
  exit 2
fi

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $python -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  nproc
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

started=$(date +%s)
timeout "${TOTAL_SECONDS:-570}" $python -m benchmarks.llm_gpu --out "$out" --docs "$out/docs" \
  --time-limit "${TIME_LIMIT:-510}" "$@" > "$out/llm_gpu.log" 2>&1
status=$?
echo "campaign: exit $status after $(( $(date +%s) - started )) s"
# The summary line of each method and the targets, as the campaign printed them.
grep -E "^[a-z_]+: |^(met|\*\*not met\*\*|not measured): " "$out/llm_gpu.log"
[ "$status" -ne 0 ] && tail -n 5 "$out/llm_gpu.log"
exit $status
