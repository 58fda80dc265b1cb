"""Built-in program harnesses: real third-party agents that play a seat (`--env.agent.harness.id
<module>`; vf.program resolves an id to `vf.harnesses.<id>`).

  mini_swe_agent  mini-SWE-agent (PyPI `mini-swe-agent`), one bash tool per call
  terminus_2      harbor's Terminus-2 (PyPI `harbor`), keystrokes into a tmux session

Each is installed once on the host at its pinned version (vf.harnesses.install) and runs inside
the rollout's runtime from that read-only install, its model calls sent to the run's
interception server: the sandbox needs no network during the episode.
"""
