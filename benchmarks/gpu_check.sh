#!/usr/bin/env bash
# The whole device command for the one-shot GPU check (run from anywhere; it cd's to the repo):
#     bash benchmarks/gpu_check.sh [extra benchmarks.gpu_check flags]
# Writes under $OUT (default /tmp/gpu_check_out): preflight.log, gpu_check.log (everything the
# check printed), gpu_check.json (the full record, rewritten after every part, so it survives a
# kill) and prints the record's short "summary" as the last line.
set -u
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # allocate on demand, so memory stats mean something
OUT="${OUT:-/tmp/gpu_check_out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 2

{
  echo "== date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)"
  echo "== nvidia-smi -L"
  nvidia-smi -L || echo "nvidia-smi -L failed (rc=$?)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit \
    --format=csv || true
  echo "== python3 -c 'import jax; print(jax.devices())'"
  timeout 120 python3 -c 'import jax; print(jax.__version__, jax.default_backend(), jax.devices())' \
    || echo "jax.devices() failed (rc=$?)"
  echo "== our imports (one interpreter; each module tried on its own)"
  timeout 180 python3 - <<'EOF' || echo "import check failed (rc=$?)"
import importlib, traceback
for m in ("kernels", "toolverse_jax.models", "toolverse_jax.sharding", "toolverse_jax.sampling",
          "toolverse_jax.rl.trainer", "benchmarks.train_step", "benchmarks.logprob_gpu_check",
          "benchmarks.gpu_check", "toolverse_jax.rl.driver", "experiments.train"):
    try:
        importlib.import_module(m)
        print(f"import {m}: ok", flush=True)
    except Exception as e:
        print(f"import {m}: FAILED {type(e).__name__}: {e}", flush=True)
EOF
} 2>&1 | tee "$OUT/preflight.log"

echo "== python3 -m benchmarks.gpu_check --out $OUT/gpu_check.json $*"
timeout -k 15 480 python3 -m benchmarks.gpu_check --out "$OUT/gpu_check.json" "$@" 2>&1 \
  | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "== gpu_check exit status $rc (124: killed by the 480 s timeout; the JSON file keeps the parts done)"
echo "== summary"
python3 - "$OUT/gpu_check.json" <<'EOF' || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no readable {sys.argv[1]}: {type(e).__name__}: {e}")
    raise SystemExit(0)
print(json.dumps({"wall_s": d.get("wall_s"), "terminated": d.get("terminated"),
                  "summary": d.get("summary")}))
EOF
exit "$rc"
