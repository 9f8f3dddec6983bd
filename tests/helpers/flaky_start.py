"""A launcher that fails like a busy Ascend host: a seeded share of its starts exits at once with
"device busy" (the card's memory still held by the previous engine), the others run the real
launcher given after `--`.

    python flaky_start.py --fail-rate 0.3 --seed 0 --count FILE [--say LINE]
        [--always-with ARG --from N] -- LAUNCHER...

`--count` appends one line per start ("fail" or "ok"): the n-th start fails when
random.Random(f"{seed}:{n}") draws below the rate, so a run is reproducible and the test can
count the failures it must find journaled. `--say` is the line a failed start prints (another
host failure: "OSError: [Errno 98] Address already in use"). `--always-with ARG --from N`: every
start whose launcher holds ARG fails from the N-th such start on (the ones before it draw as the
others do); their lines read "fail ARG" / "ok ARG".
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

BUSY = "RuntimeError: NPU device busy: card 0 memory not yet free (held by a previous engine)"


def draw(count_file: Path, rate: float, seed: int, matched: str | None = None, from_nth: int = 1) -> bool:
    """Whether this start fails; its line appended to `count_file`. `matched`: the ARG this start
    holds, which fails it from the `from_nth` start holding it on."""
    lines = count_file.read_text().splitlines() if count_file.exists() else []
    fails = random.Random(f"{seed}:{len(lines)}").random() < rate
    if matched is not None:
        fails = fails or sum(line.endswith(f" {matched}") for line in lines) + 1 >= from_nth
    with count_file.open("a", encoding="utf-8") as fh:
        fh.write(("fail" if fails else "ok") + (f" {matched}" if matched is not None else "") + "\n")
    return fails


def main() -> int:
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=Path, required=True)
    parser.add_argument("--say", default=BUSY)
    parser.add_argument("--always-with")
    parser.add_argument("--from", dest="from_nth", type=int, default=1)
    args = parser.parse_args(sys.argv[1:split])
    launcher = sys.argv[split + 1:]
    matched = args.always_with if args.always_with is not None and args.always_with in launcher else None
    if draw(args.count, args.fail_rate, args.seed, matched, args.from_nth):
        print(args.say, file=sys.stderr)
        return 1
    os.execv(launcher[0], launcher)


if __name__ == "__main__":
    sys.exit(main())
