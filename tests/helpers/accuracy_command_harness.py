"""An in-house accuracy harness for the tests (the `command` harness): it asks the server's
/v1/completions for every sample of the dataset, greedy, and writes one line per sample.

    python accuracy_command_harness.py BASE_URL MODEL DATASET OUTPUT [--behave ok|exit|nothing|garbage|empty]
        [--die-rate R --seed S --count FILE] [--repeats N --temperature T]

`--repeats` asks every sample N times (at `--temperature`) and writes the share of its runs that
were right, with `runs: N` (a sampled evaluation).

`--behave` plays a broken harness: exit 3, write no file, write a line that is not JSON, write
an empty file. `--die-rate` plays a harness whose connection to the server is reset in a seeded
share of its runs (tests/helpers/flaky_start.py's draw, one line per run in `--count`).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

from flaky_start import draw  # run by its path: its own folder is on sys.path


def ask(args: argparse.Namespace, prompt: str) -> tuple[str, str]:
    """The server's answer to one prompt and why it stopped."""
    body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
                       "temperature": args.temperature}).encode()
    request = urllib.request.Request(args.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        choice = json.loads(response.read())["choices"][0]
    return choice["text"].strip(), choice["finish_reason"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("model")
    parser.add_argument("dataset")
    parser.add_argument("output")
    parser.add_argument("--behave", default="ok", choices=["ok", "exit", "nothing", "garbage", "empty"])
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--die-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    if args.count is not None and draw(args.count, args.die_rate, args.seed):
        print("harness: [Errno 104] Connection reset by peer", file=sys.stderr)
        return 3
    if args.behave == "exit":
        print("harness: cannot reach the scoring service", file=sys.stderr)
        return 3
    if args.behave == "nothing":
        return 0
    with open(args.output, "w", encoding="utf-8") as out:
        if args.behave == "garbage":
            out.write("accuracy: 60%\n")
            return 0
        if args.behave == "empty":
            return 0
        with open(args.dataset, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        for row in rows:
            answers = [ask(args, row["question"]) for _ in range(args.repeats)]
            right = sum(answer == row["answer"] for answer, _ in answers)
            answer, finish_reason = answers[-1]
            line = {"id": row["id"], "correct": right == 1, "output": answer, "target": row["answer"],
                    "finish_reason": finish_reason}
            if args.repeats > 1:
                line.update(correct=right / args.repeats, runs=args.repeats)
            out.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
