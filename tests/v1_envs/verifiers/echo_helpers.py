"""A sibling module: loading echo_v1.py by path must make this importable."""


def normalize(text: str) -> str:
    return " ".join(text.lower().split())
