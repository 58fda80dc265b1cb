#!/usr/bin/env bash
set -euo pipefail
# v0 evaluation
vf-eval my-env -a '{"difficulty": "hard", "num_examples": 50}' -n 10 -r 3 -m gpt-4.1-mini \
  -b http://localhost:8000/v1 -k OPENAI_API_KEY -T 0.7 -t 512 -s
vf-eval configs/eval.toml --shuffle --shuffle-seed 3 -x '{"max_turns": 4}'
vf-eval my-env -R outputs/evals/my-env--gpt/ab12cd34 -d
uv run eval reverse-text-v1 --num-tasks 5 --env.taskset.size 50 --client.base-url http://x/v1 --no-push
vf-eval gsm8k @ configs/gsm8k.toml -s --select.seed 7 --run.name demo -o outputs
vf-eval reverse-text -n 5 -r 2 --base-url http://127.0.0.1:8000/v1 --sampling.temperature 0.5
vf-install my-env
vf-vllm --model Qwen/Qwen3-0.6B --port 8000 --enforce-eager && vf-tui
vf-rl @ configs/rl.toml
vf-replay outputs/run1 -o replayed
eval "$CMD"
