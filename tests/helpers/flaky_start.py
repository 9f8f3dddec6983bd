"""A launcher that fails like a busy Ascend host: a seeded share of its starts exits at once with
"device busy" (the card's memory still held by the previous engine), the others run the real
launcher given after `--`.

    python flaky_start.py --fail-rate 0.3 --seed 0 --count FILE -- LAUNCHER...

`--count` appends one line per start ("fail" or "ok"): the n-th start fails when
random.Random(f"{seed}:{n}") draws below the rate, so a run is reproducible and the test can
count the failures it must find journaled.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path


def draw(count_file: Path, rate: float, seed: int) -> bool:
    """Whether this start fails; its line appended to `count_file`."""
    n = len(count_file.read_text().splitlines()) if count_file.exists() else 0
    fails = random.Random(f"{seed}:{n}").random() < rate
    with count_file.open("a", encoding="utf-8") as fh:
        fh.write("fail\n" if fails else "ok\n")
    return fails


def main() -> int:
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:split])
    launcher = sys.argv[split + 1:]
    if draw(args.count, args.fail_rate, args.seed):
        print("RuntimeError: NPU device busy: card 0 memory not yet free (held by a previous engine)", file=sys.stderr)
        return 1
    os.execv(launcher[0], launcher)


if __name__ == "__main__":
    sys.exit(main())
