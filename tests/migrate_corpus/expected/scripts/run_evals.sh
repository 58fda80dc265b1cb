#!/usr/bin/env bash
set -euo pipefail
# v0 evaluation
vf-eval my-env --taskset.difficulty hard --taskset.num_examples 50 -n 10 -r 3 -m gpt-4.1-mini --base-url http://localhost:8000/v1 --api-key-var OPENAI_API_KEY --sampling.temperature 0.7 --sampling.max-tokens 512
vf-eval --config configs/eval.yaml --select.shuffle true --select.seed 3 --max-turns 4
vf-eval my-env --resume outputs/evals/my-env--gpt/ab12cd34
vf-eval reverse-text -n 5 --taskset.size 50 --base-url http://x/v1
vf-eval gsm8k --config configs/gsm8k.yaml --select.shuffle true --select.seed 7 -o outputs/demo
vf-eval reverse-text -n 5 -r 2 --base-url http://127.0.0.1:8000/v1 --sampling.temperature 0.5
vf-install my-env  # TODO(vf-migrate): vf-install is gone; pip install -e the environment package, or pass the module path to vf-eval
vf-serve --model Qwen/Qwen3-0.6B --port 8000 && vf-tui  # TODO(vf-migrate): vf-tui is gone; read summary.json / traces.jsonl of the run dir (vf-eval --score DIR --json)
vf-train configs/rl.yaml
vf-eval --score outputs/run1
eval "$CMD"
