#!/usr/bin/env bash
# The whole device command for GRPO vs TARA from SmolLM2-135M-Instruct (run from anywhere):
#     bash benchmarks/gpu_learning.sh [extra benchmarks.gpu_learning flags]
# If the transfer folder .gpu_transfer/ holds a manifest (benchmarks/gpu_transfer.py split / pack,
# parts carried over earlier calls), its parts are joined (every sha256 checked; a missing or
# corrupt part stops here, by name), the wheels are installed into /tmp/site and the GGUF is
# passed as --gguf. Writes under $OUT (default /tmp/gpu_learning_out): preflight.log,
# gpu_learning.log (everything printed), gpu_learning.json (the record, rewritten after every
# part, so it survives a kill) and prints the record's summary as the last line. <= 8 min.
set -u
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT="${OUT:-/tmp/gpu_learning_out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 2
T=.gpu_transfer
SITE=/tmp/site
gguf=()

{
  echo "== date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "nvidia-smi failed"
} 2>&1 | tee "$OUT/preflight.log"

if [ -f "$T/manifest.json" ]; then
  echo "== join + install ($T)" | tee -a "$OUT/preflight.log"
  python3 -m benchmarks.gpu_transfer join 2>&1 | tee -a "$OUT/preflight.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "join failed: nothing was run"; exit 3; }
  if [ -d "$T/joined/wheels" ]; then
    python3 -m benchmarks.gpu_transfer install --target "$SITE" 2>&1 | tee -a "$OUT/preflight.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "install failed: nothing was run"; exit 3; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  f=$(ls "$T"/joined/*.gguf 2>/dev/null | head -1)
  [ -n "$f" ] && gguf=(--gguf "$PWD/$f")
fi

echo "== imports" | tee -a "$OUT/preflight.log"
timeout 120 python3 - <<'EOF' 2>&1 | tee -a "$OUT/preflight.log"
import importlib
for m in ("ml_collections", "grain", "mcp", "tensorboardX", "gguf", "experiments.train",
          "toolverse_jax.rl.tool_use", "benchmarks.gpu_learning"):
    try:
        importlib.import_module(m)
        print(f"import {m}: ok", flush=True)
    except Exception as e:
        print(f"import {m}: FAILED {type(e).__name__}: {e}", flush=True)
EOF

echo "== python3 -m benchmarks.gpu_learning --out $OUT/gpu_learning.json ${gguf[*]} $*"
timeout -k 15 480 python3 -m benchmarks.gpu_learning --out "$OUT/gpu_learning.json" \
  "${gguf[@]}" "$@" 2>&1 | tee "$OUT/gpu_learning.log"
rc=${PIPESTATUS[0]}
echo "== gpu_learning exit status $rc (124: killed by the 480 s timeout; the JSON keeps the parts done)"
python3 - "$OUT/gpu_learning.json" <<'EOF' || true
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
