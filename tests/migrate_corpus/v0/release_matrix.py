"""Merge v0_reference.py's output of each verifiers release into release_matrix.json.

    python release_matrix.py OUT_DIR    # OUT_DIR/<release>.json: v0_reference.py run by that release

For every release and env: the reward of each case ([reward, [scores]]), or why that release could
not score it ("unavailable: ..." when the module needs API the release lacks, "error: ..." when
scoring failed). tests/test_migrate_corpus.py holds each env's golden (the release it was written
for) to the same numbers and, with `-m v0ref`, any release's live run to its column here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RELEASES = ["0.1.0", "0.1.1", "0.1.2", "0.1.3", "0.1.4", "0.1.5", "0.1.6", "0.1.7", "0.1.8", "0.1.9", "0.1.10",
            "0.1.11", "0.1.12", "0.1.14", "0.2.0", "0.2.1", "0.3.0", "0.3.1"]
"""Every release from 0.1.0 to 0.3.x (0.1.13 was never released: only its dev builds were)."""


def column(live: dict) -> dict:
    out = {}
    for env, got in sorted(live.items()):
        if isinstance(got, list):
            out[env] = [[c["reward"], c["scores"]] for c in got]
        else:
            (kind, why), = got.items()
            out[env] = f"{kind}: {why}"
    return out


def main() -> None:
    src = Path(sys.argv[1])
    matrix = {r: column(json.loads((src / f"{r}.json").read_text())) for r in RELEASES}
    (HERE / "release_matrix.json").write_text(json.dumps(matrix, indent=1) + "\n")


if __name__ == "__main__":
    main()
