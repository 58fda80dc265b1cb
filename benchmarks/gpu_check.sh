#!/usr/bin/env bash
# The parallel paths on GPUs (NCCL), in under 10 minutes on a machine with >= 2 CUDA devices:
# vf-train at ep 2, cp 2 (ring and Ulysses) and cp 2 × ep 2 on 2 GPUs against 1 GPU on the same
# batches (--async.deterministic). Exit 1 on a loss mismatch. (`vf-bench parallel` measures on
# CPU/gloo only so far: it has no GPU mode.)
# The code is the CPU-tested code (trainer/parallel.py picks NCCL when --model.device is cuda);
# this script has not run yet on GPUs (no GPU machine was available when it was written).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-$(mktemp -d)}"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -lt 2 ]; then
  echo "gpu_check: needs 2 CUDA devices (found $GPUS); NCCL cannot put two ranks on one device" >&2
  exit 2
fi
MOE="$OUT/moe"
python - "$MOE" <<'PY'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "tests")
from test_router_replay import build_moe
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True); build_moe(out)
PY
ARGS=(--model.device cuda --warmup.steps 1 --warmup.batch-size 8 --batch-size 8 --group-size 4
      --eval.at-start false --eval.at-end false --seed 7 --trainer.micro-batch-size 2 --trainer.seq-len 96
      --steps 2 --async.deterministic)
run() {  # name nproc extra...
  local name=$1 n=$2; shift 2
  if [ "$n" -gt 1 ]; then
    torchrun --standalone --nproc_per_node "$n" -m vf.commands.train -o "$OUT/$name" "${ARGS[@]}" "$@"
  else
    python -m vf.commands.train -o "$OUT/$name" "${ARGS[@]}" "$@"
  fi
}
same() {  # reference candidate: per-step losses within 1e-4 (bf16-free fp32 on both)
  python - "$OUT/$1" "$OUT/$2" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:])
ok = len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1, abs(x)) for x, y in zip(a, b))
print(("ok  " if ok else "FAIL"), sys.argv[2], b, "vs", a)
sys.exit(0 if ok else 1)
PY
}
run one-moe 1 --model "$MOE"
run ep2 2 --model "$MOE" --parallel.ep 2 && same one-moe ep2
run cp2ep2 2 --model "$MOE" --parallel.ep 2 --parallel.cp 2 && same one-moe cp2ep2
run one-dense 1
run ring 2 --parallel.cp 2 && same one-dense ring
run ulysses 2 --parallel.cp 2 --parallel.cp-style ulysses && same one-dense ulysses
echo "gpu_check: all parity checks passed; results in $OUT"
