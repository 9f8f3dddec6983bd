"""How many of the nightly's multi-node recipes become a LeaderWorkerSet that passes the checks.

    .venv/bin/python bench/nightly_lws_bench.py --repo ../vllm-ascend [--ref HEAD]

Every multi-node case file under `tests/e2e/nightly/` at REF is imported benchmark by benchmark
(`import-nightly`'s code); each imported recipe is turned into a manifest (`recipes lws`'s code)
and read back against the LeaderWorkerSet fields of tests/helpers/leaderworkerset.py. Prints the
counts, the group sizes, how many needed the worker dispatcher, and each refusal's line.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bisect_npu import api
from bisect_npu.errors import UsageError
from bisect_npu.nightly.cases import import_case, read_case_file, several_nodes
from tests.helpers.leaderworkerset import LeaderWorkerSet


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a vllm-ascend clone")
    parser.add_argument("--ref", default="HEAD")
    args = parser.parse_args()
    paths = [path for path in git(args.repo, "ls-tree", "-r", "--name-only", args.ref, "tests/e2e/nightly").split()
             if path.endswith(".yaml")]
    files, imported, manifests, dispatched = 0, 0, 0, 0
    sizes: collections.Counter[int] = collections.Counter()
    refusals: set[str] = set()
    for path in paths:
        try:
            raw = read_case_file(git(args.repo, "show", f"{args.ref}:{path}"), path)
        except UsageError:
            continue
        if not several_nodes(raw, path):
            continue
        files += 1
        for benchmark in raw.get("benchmarks") or {}:
            try:
                recipe = import_case(raw, path, None, str(benchmark))
            except UsageError:
                continue
            imported += 1
            try:
                manifest = api.recipe_lws(recipe, "registry.example/vllm-ascend:candidate")
            except UsageError as refused:
                refusals.add(str(refused))
                continue
            template = LeaderWorkerSet.model_validate(yaml.safe_load(yaml.safe_dump(manifest))).spec \
                .leaderWorkerTemplate
            manifests += 1
            sizes[template.size] += 1
            dispatched += template.workerTemplate.spec.containers[0].command[:2] == ["python3", "-c"]
    print(f"{args.ref} ({git(args.repo, 'rev-parse', '--short=12', args.ref).strip()}): {files} multi-node files, "
          f"{imported} recipes imported, {manifests} LeaderWorkerSets checked, {len(refusals)} refusal line(s); "
          f"group sizes {dict(sorted(sizes.items()))}; worker dispatcher in {dispatched}")
    for line in sorted(refusals):
        print(f"  refused: {line}")


if __name__ == "__main__":
    main()
