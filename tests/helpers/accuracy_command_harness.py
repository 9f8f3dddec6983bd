"""An in-house accuracy harness for the tests (the `command` harness): it asks the server's
/v1/completions for every sample of the dataset, greedy, and writes one line per sample.

    python accuracy_command_harness.py BASE_URL MODEL DATASET OUTPUT [--behave ok|exit|nothing|garbage|empty]
        [--die-rate R --seed S --count FILE]

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
            body = json.dumps({"model": args.model, "prompt": row["question"], "max_tokens": args.max_tokens,
                               "temperature": 0.0}).encode()
            request = urllib.request.Request(args.base_url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                choice = json.loads(response.read())["choices"][0]
            answer = choice["text"].strip()
            out.write(json.dumps({"id": row["id"], "correct": answer == row["answer"], "output": answer,
                                  "target": row["answer"], "finish_reason": choice["finish_reason"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
