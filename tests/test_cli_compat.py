"""verifiers 0.4.0's vf-eval spellings on our vf-eval / vf-rollout, vf-validate, vf-init, run-dir
version records: real subprocesses against the stub server on loopback."""

from __future__ import annotations

import json

from conftest import json_out

from vf.cli_compat import translate_key


def test_key_table_maps_verifiers_keys_onto_ours():
    assert translate_key("client.base-url") == "engine.base_url"
    assert translate_key("client.api_key_var") == "engine.api_key_var"
    assert translate_key("env.taskset.max-words") == "taskset.max_words"
    assert translate_key("env.agent.harness.id") == "env.agent.harness.id"  # passes through
    assert translate_key("select.shuffle") == "select.shuffle"
    assert translate_key("sampling.max_tokens") == "sampling.max_tokens"
    assert translate_key("push") is None and translate_key("rich.show_logs") is None


def test_verifiers_spellings_run_and_write_a_verifiers_readable_run_dir(tmp_path, stub, cli):
    proc = cli("vf-eval", "reverse-text", "-m", "reverse", "--client.base-url", stub.url,
               "--client.api-key-var", "VF_TEST_KEY", "--env.taskset.size", "6", "--env.taskset.max-words", "1",
               "--select.limit", "4", "--num-rollouts", "2", "--max-concurrent", "4",
               "-o", str(tmp_path), "--run.name", "rt", "--no-push", "--no-rich", "--json",
               env={"VF_TEST_KEY": "sk-test"}, check=True)
    summary = json_out(proc)
    assert summary["num_episodes"] == 8 and summary["mean_reward"] == 1.0
    assert summary["run_dir"] == str(tmp_path / "rt")
    assert "--no-push is a verifiers option with no effect" in proc.stderr
    resolved = json.loads((tmp_path / "rt" / "configs" / "resolved" / "eval.json").read_text())
    assert resolved["env"]["taskset"] == {"id": "reverse-text", "size": 6, "max_words": 1}
    assert resolved["client"] == {"base_url": stub.url, "api_key_var": "VF_TEST_KEY", "type": "eval"}
    assert resolved["num_rollouts"] == 2 and resolved["select"]["limit"] == 4
    assert resolved["run"]["name"] == "rt" and resolved["output_dir"] == str(tmp_path)
    version = json.loads((tmp_path / "rt" / "version.json").read_text())
    from vf.version import __version__

    assert version["name"] == "vf" and version["version"] == __version__ and "commit" in version
    # the resolved file re-runs the same eval (verifiers' `vf-eval @ RUN/configs/resolved/eval.json`)
    again = json_out(cli("vf-eval", "@", str(tmp_path / "rt" / "configs" / "resolved" / "eval.json"),
                         "-o", str(tmp_path / "again"), "--json", env={"VF_TEST_KEY": "sk-test"}, check=True))
    assert again["num_episodes"] == 8 and again["run_dir"] == str(tmp_path / "again" / "rt")


def test_at_toml_file_layers_under_flags(tmp_path, stub, cli):
    toml = tmp_path / "eval.toml"
    toml.write_text(f'model = "reverse"\nnum_rollouts = 3\npush = false\n\n[client]\nbase_url = "{stub.url}"\n\n'
                    '[env.taskset]\nsize = 5\n\n[select]\nlimit = 5\n')
    summary = json_out(cli("vf-eval", "reverse-text", "@", str(toml), "-n", "2", "--output-dir", str(tmp_path / "runs"),
                           "--json", check=True))
    assert summary["num_episodes"] == 6  # -n on the command line beats the file's select.limit
    assert summary["mean_reward"] == 1.0
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("reverse-text--reverse--")


def test_validate_passes_gold_and_fails_a_broken_reward(tmp_path, cli):
    ok = cli("vf-validate", "reverse-text", "-n", "4", "--json", check=True)
    assert json.loads(ok.stdout) == {"taskset": "reverse-text", "num_tasks": 4, "num_passed": 4, "failures": []}
    broken = tmp_path / "broken.py"
    broken.write_text(
        "import vf\n\n"
        "class D(vf.TaskData):\n    answer: str\n\n"
        "class T(vf.Task[D, vf.State, vf.TaskConfig]):\n"
        "    @vf.stop\n    def one(self, trace) -> bool:\n        return trace.num_turns >= 1\n\n"
        "    @vf.reward(weight=1.0)\n    def exact(self, task, trace) -> float:\n"
        "        return float(trace.last_reply == task.answer)\n\n"
        "    def validate(self):\n        return self.data.answer + '!' if self.data.id == 'b' else self.data.answer\n\n"
        "class S(vf.Taskset[T, vf.TasksetConfig]):\n"
        "    def load(self):\n        yield D(id='a', prompt='x', answer='1')\n        yield D(id='b', prompt='y', answer='2')\n")
    bad = cli("vf-validate", str(broken), "--json")
    assert bad.returncode == 3
    report = json.loads(bad.stdout)
    assert report["num_passed"] == 1 and [f["task"] for f in report["failures"]] == ["b"]
    assert report["failures"][0]["reward"] == 0.0 and "FAIL b" in bad.stderr and "Traceback" not in bad.stderr


def test_init_scaffold_loads_validates_and_runs(tmp_path, stub, cli):
    cli("vf-init", "my-env", "-p", str(tmp_path), check=True)
    project = tmp_path / "my_env"
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "my_env", "pyproject.toml"]
    import tomllib

    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "my-env" and meta["project"]["entry-points"]["vf.environments"] == {
        "my-env": "my_env"}
    report = json.loads(cli("vf-validate", str(project / "my_env"), "--json", check=True).stdout)
    assert report["num_tasks"] == 5 and report["num_passed"] == 5
    again = cli("vf-init", "my-env", "-p", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert cli("vf-init", "9lives", "-p", str(tmp_path)).returncode == 2


def test_commands_without_config_keys_refuse_dotted_flags(cli):
    p = cli("vf-serve", "--port", "0", "--sampling.temperature", "1")
    assert p.returncode == 2 and "takes no config keys" in p.stderr and "Traceback" not in p.stderr
