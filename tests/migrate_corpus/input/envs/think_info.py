import json

import verifiers as vf


def load_environment(use_think=True, min_words=2):
    parser = vf.ThinkParser() if use_think else vf.Parser()

    def keyword_hit(completion, info, parser) -> float:
        text = (parser.parse_answer(completion) or "").lower()
        return 1.0 if info["keyword"] in text else 0.0

    def long_enough(completion, state) -> float:
        words = len(state["completion"][-1]["content"].split())
        return 1.0 if words >= min_words else 0.0

    rows = [
        {"prompt": [{"role": "user", "content": "Name a fruit."}], "info": json.dumps({"keyword": "apple"})},
        {"prompt": [{"role": "user", "content": "Name a colour."}], "info": {"keyword": "red"}},
    ]
    rubric = vf.Rubric(funcs=[keyword_hit], parser=parser)
    rubric.add_reward_func(parser.get_format_reward_func(), weight=0.5)
    rubric.add_metric(long_enough)
    return vf.SingleTurnEnv(dataset=rows, parser=parser, rubric=rubric)
