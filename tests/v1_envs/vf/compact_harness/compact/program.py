"""The `compact` harness's agent program (stdlib only: it runs with whatever python3 the runtime has).

    python3 program.py REQUEST_JSON        (OPENAI_BASE_URL, OPENAI_API_KEY in the environment)

REQUEST_JSON names the model, the prompt, an optional system prompt, `max_turns` and
`answer_file`. The loop: chat completions with one `bash` tool, each call's commands run with
`bash -c` in the working directory and their output sent back, until a reply calls no tool (or
`max_turns` calls). Then it compacts: the intermediate text reply is dropped and one more call
asks for the final answer on the tool exchange alone, a history that does not extend the
previous one. The final answer goes to stdout and to `answer_file`.
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the working directory.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
FINAL = "Reply with the final answer only."
TRANSPORT_ERROR = 97
"""Exit status for a model call that failed at the transport (MODEL_TRANSPORT_ERROR_EXIT_CODE: the
harness reports it as an interception error, not the program's own failure)."""


def chat(model, messages, tools):
    body = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["choices"][0]["message"]
    except (urllib.error.URLError, OSError) as e:
        print(f"model call failed: {e}", file=sys.stderr)
        sys.exit(TRANSPORT_ERROR)


def run_bash(call):
    command = json.loads(call["function"].get("arguments") or "{}").get("command", "")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False)
    return (done.stdout + done.stderr).strip()


def main(path):
    with open(path) as f:
        request = json.load(f)
    opening = ([{"role": "system", "content": request["system"]}] if request.get("system") else []) + [
        {"role": "user", "content": request["prompt"]}]
    messages = list(opening)
    reply = {}
    for _ in range(request["max_turns"]):
        reply = chat(request["model"], messages, [BASH])
        calls = reply.get("tool_calls") or []
        messages.append({"role": "assistant", "content": reply.get("content") or "", **({"tool_calls": calls} if calls else {})})
        if not calls:
            break
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_bash(call)})
    # compaction: keep the tool exchange, drop the text reply that followed it
    kept = messages[:-1] if not reply.get("tool_calls") else messages
    final = chat(request["model"], kept + [{"role": "user", "content": FINAL}], [BASH])
    answer = (final.get("content") or "").strip()
    with open(request["answer_file"], "w") as f:
        f.write(answer + "\n")
    print(answer)


if __name__ == "__main__":
    main(sys.argv[1])
