"""Runs inside the overlay container (stdlib only) before the new tree is copied in.

Never imported: `docker.overlay_helper()` reads this file's bytes and copies it into the container,
whose Python has no `bisect_npu`, so it must import nothing but the standard library.

Removes the files the candidate no longer has (and the bytecode caches, so no stale .pyc is ever
imported), gives the package installed from the source directory the candidate's version (the
base image's metadata names the base commit's), then deletes itself. The plan is JSON:
{"source_dir": "/abs/dir", "delete": ["rel/path", ...], "version": "0.11.0rc0+12.gabc"}, and
optionally "clear": [{"dir": "rel/dir", "keep": ["_version.py"]}] (a dependency's tree replaced
whole: builders/dependency.py) and "import_path": true (source_dir made and put on the import path,
for a dependency the image never installed).
"""

import fnmatch
import glob
import importlib.metadata
import json
import os
import re
import shutil
import sys
import sysconfig


def installed_from(root: str) -> list[str]:
    """Metadata files of the packages installed (editable) from `root`: a dist-info whose
    direct_url.json points at it, or an egg-info inside it."""
    found = []
    for dist in importlib.metadata.distributions():
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        path = getattr(dist, "_path", None)  # PathDistribution's folder: the only way to its files
        if path is not None and url.startswith("file://") and os.path.realpath(url[len("file://"):]) == root:
            found.append(os.path.join(str(path), "METADATA"))
    found += glob.glob(os.path.join(root, "*.egg-info", "PKG-INFO"))
    return [path for path in found if os.path.isfile(path)]


def set_version(metadata_file: str, version: str) -> None:
    with open(metadata_file, encoding="utf-8") as fh:
        text = fh.read()
    with open(metadata_file, "w", encoding="utf-8") as fh:
        fh.write(re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.MULTILINE))
    print(f"overlay: {metadata_file} says version {version}")


def clear_tree(root: str, relative: str, keep: list[str]) -> int:
    """Remove every file under root/relative but those whose name matches a `keep` pattern (a
    dependency's generated _version.py): the tree copied in next replaces the rest."""
    directory = os.path.realpath(os.path.join(root, relative))
    if directory != root and not directory.startswith(root + os.sep):
        print(f"overlay: refusing to clear {relative!r} outside {root}", file=sys.stderr)
        return 1
    removed = 0
    for current, _, files in os.walk(directory):
        for name in files:
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in keep):
                os.unlink(os.path.join(current, name))
                removed += 1
    print(f"overlay: cleared {removed} file(s) under {directory}")
    return 0


def add_import_path(root: str) -> None:
    """A dependency the image never installed: its directory made, and put on the interpreter's
    path by a .pth file in site-packages (the tree copied in next is then importable)."""
    os.makedirs(root, exist_ok=True)
    name = "bisect_npu_" + re.sub(r"[^A-Za-z0-9_]", "_", root.strip("/")) + ".pth"
    with open(os.path.join(sysconfig.get_paths()["purelib"], name), "w", encoding="utf-8") as fh:
        fh.write(root + "\n")
    print(f"overlay: {root} on the import path ({name})")


def main(plan_path: str) -> int:
    with open(plan_path, encoding="utf-8") as fh:
        plan = json.load(fh)
    root = os.path.realpath(plan["source_dir"])
    if plan.get("import_path"):
        add_import_path(root)
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
    for clear in plan.get("clear", []):
        status = clear_tree(root, str(clear["dir"]), list(clear.get("keep", [])))
        if status:
            return status
    if plan.get("version"):
        for metadata_file in installed_from(root):
            set_version(metadata_file, plan["version"])
    for directory, subdirs, _ in os.walk(root):
        if "__pycache__" in subdirs:
            shutil.rmtree(os.path.join(directory, "__pycache__"))
            subdirs.remove("__pycache__")
    shutil.rmtree(os.path.dirname(os.path.abspath(plan_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
