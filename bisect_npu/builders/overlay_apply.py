"""Runs inside the overlay container (stdlib only) before the new tree is copied in.

Never imported: `docker.overlay_helper()` reads this file's bytes and copies it into the container,
whose Python has no `bisect_npu`, so it must import nothing but the standard library.

Removes the files the candidate no longer has (and the bytecode caches, so no stale .pyc is ever
imported), then deletes itself. The plan is JSON: {"source_dir": "/abs/dir", "delete": ["rel/path", ...]}.
"""

import json
import os
import shutil
import sys


def main(plan_path: str) -> int:
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    root = os.path.realpath(plan["source_dir"])
    if not os.path.isdir(root):
        print(f"overlay: {root} is not a directory in the base image", file=sys.stderr)
        return 1
    for relative in plan["delete"]:
        target = os.path.realpath(os.path.join(root, relative))
        if not target.startswith(root + os.sep):
            print(f"overlay: refusing to delete {relative!r} outside {root}", file=sys.stderr)
            return 1
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
    for directory, subdirs, _ in os.walk(root):
        if "__pycache__" in subdirs:
            shutil.rmtree(os.path.join(directory, "__pycache__"))
            subdirs.remove("__pycache__")
    shutil.rmtree(os.path.dirname(os.path.abspath(plan_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
