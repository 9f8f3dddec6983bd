"""A FAKE of GitHub's `gh` CLI (GitHub cannot be reached from the tests): the few calls the action's
issue step makes, answered from a JSON file of issues (FAKE_GH_STATE), every call logged there.

    issue list --repo R --label L --state all --limit N --json number,url,state,body
    label create L --repo R --force --color C --description D
    issue create --repo R --title T --label L --body-file F   (prints the new issue's URL)
    issue comment N --repo R --body-file F
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def main(args: list[str]) -> int:
    if not os.environ.get("GH_TOKEN"):
        print("gh: To use GitHub CLI in a GitHub Actions workflow, set the GH_TOKEN environment variable.",
              file=sys.stderr)
        return 4
    state_path = Path(os.environ["FAKE_GH_STATE"])
    state = json.loads(state_path.read_text()) if state_path.exists() else {"issues": [], "labels": [], "calls": []}
    state["calls"].append(args)
    repo = option(args, "--repo")
    if args[:2] == ["issue", "list"]:
        label = option(args, "--label")
        fields = option(args, "--json").split(",")
        found = [{k: issue[k] for k in fields} for issue in state["issues"]
                 if issue["repo"] == repo and label in issue["labels"]]
        print(json.dumps(found))
    elif args[:2] == ["label", "create"]:
        if args[2] in state["labels"] and "--force" not in args:
            print(f"label with name \"{args[2]}\" already exists", file=sys.stderr)
            return 1
        state["labels"] = sorted({*state["labels"], args[2]})
    elif args[:2] == ["issue", "create"]:
        label = option(args, "--label")
        if label not in state["labels"]:
            print(f"could not add label: '{label}' not found", file=sys.stderr)
            return 1
        number = len(state["issues"]) + 1
        url = f"https://github.com/{repo}/issues/{number}"
        state["issues"].append({"number": number, "url": url, "state": "OPEN", "repo": repo, "labels": [label],
                                "title": option(args, "--title"), "body": Path(option(args, "--body-file")).read_text(),
                                "comments": []})
        print(url)
    elif args[:2] == ["issue", "comment"]:
        issue = next(i for i in state["issues"] if i["number"] == int(args[2]) and i["repo"] == repo)
        issue["comments"].append(Path(option(args, "--body-file")).read_text())
        print(f"{issue['url']}#issuecomment-{len(issue['comments'])}")
    else:
        print(f"fake gh: no answer for {args}", file=sys.stderr)
        return 1
    state_path.write_text(json.dumps(state))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
