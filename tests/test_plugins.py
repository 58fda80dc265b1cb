"""One plugin grammar (vf.imports.import_plugin) behind every resolver: tasksets, harnesses,
judges and losses take the same reference forms, and each refuses host code a run dir names."""

import textwrap

import pytest

from vf.episode.harnesses import harness_class
from vf.episode.loading import taskset_class
from vf.errors import UsageError
from vf.harness import Harness
from vf.imports import import_plugin, untrusted_config
from vf.judge import Judge, judge_class
from vf.taskset import Taskset
from vf.trainer import losses

PLUGINS = '''
import vf
from vf.harness import Harness
from vf.judge import Judge

class MyTaskset(vf.Taskset):
    pass

class MyHarness(Harness):
    pass

class MyJudge(Judge):
    pass

def my_loss(logprobs, inference_logprobs, advantages, loss_mask):
    return (logprobs * loss_mask).sum()
'''

RESOLVERS = {
    "taskset": (lambda ref: taskset_class(ref), "MyTaskset", Taskset),
    "harness": (harness_class, "MyHarness", Harness),
    "judge": (judge_class, "MyJudge", Judge),
    "loss": (lambda ref: losses.get(ref).fn, "my_loss", None),
}


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "my_plugins.py"
    path.write_text(textwrap.dedent(PLUGINS))
    return path


@pytest.mark.parametrize("kind", sorted(RESOLVERS))
def test_every_resolver_takes_a_file_attr_reference(kind, plugin_file):
    resolve, attr, base = RESOLVERS[kind]
    found = resolve(f"{plugin_file}:{attr}")
    assert found.__name__ == attr
    if base is not None:
        assert issubclass(found, base)


@pytest.mark.parametrize("kind", sorted(RESOLVERS))
def test_every_resolver_refuses_host_code_a_run_dir_names(kind, plugin_file):
    resolve, attr, _ = RESOLVERS[kind]
    with untrusted_config("run dir runs/x (config.yaml)"), pytest.raises((UsageError, ValueError),
                                                                         match="--trust-run-dir"):
        resolve(f"{plugin_file}:{attr}")


def test_built_ins_resolve_under_an_untrusted_config():
    with untrusted_config("run dir runs/x (config.yaml)"):
        assert taskset_class("reverse-text").__name__ == "ReverseTextTaskset"
        assert issubclass(harness_class("mini-swe-agent"), Harness)
        assert judge_class("rubric").__name__ == "RubricJudge"
        assert losses.get("ipo").name == "ipo"


def test_ids_normalise_and_unknown_ones_are_none(tmp_path):
    module, attr = import_plugin("taskset", "someone/Reverse-Text@1.2", builtin="vf.environments")
    assert module.__name__ == "vf.environments.reverse_text" and attr is None
    assert import_plugin("taskset", "no-such-plugin-xyz", builtin="vf.environments") is None
    assert import_plugin("taskset", str(tmp_path / "missing.py")) is None
