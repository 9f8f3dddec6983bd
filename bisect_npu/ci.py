"""The steps of the GitHub Actions composite action (`action.yml`), as plain functions.

`bisect_step` starts a bisection, or resumes the session of a retried job (GitHub's run attempt
above 1 with the session's journal on this runner), runs `bisect-npu` as an argument list (the
inputs come through the environment, never through a shell), writes the report to the job summary
and the answer to the step's outputs. `issue_step` opens one issue per culprit, or comments on
the one already open for it: each issue carries a marker naming the culprit's sha, so a nightly
job that finds the same culprit again updates its issue rather than filing another. GitHub is
reached through its `gh` CLI, called with argument lists.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_npu.defaults import LAST_GOOD
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.journal import JOURNAL_FILE
from bisect_npu.paths import cache_root

# GitHub's limits: a step summary up to 1 MiB, an issue body or comment up to 65,536 characters.
SUMMARY_LIMIT = 1_000_000
BODY_LIMIT = 60_000
ANSWERS = ("found", "narrowed")  # a culprit or a range is an answer; the rest fail the job


def marker(culprit: str) -> str:
    """The line an issue body carries to say which culprit it is about."""
    return f"<!-- bisect-npu culprit: {culprit} -->"


@dataclass(frozen=True)
class Actions:
    """What GitHub Actions hands a step: its environment files and the run's identity."""

    output: Path | None
    summary: Path | None
    run_attempt: int
    run_id: str
    repository: str
    job: str
    server_url: str

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Actions:
        attempt = env.get("GITHUB_RUN_ATTEMPT", "1")
        if not attempt.isdigit():
            raise UsageError(f"GITHUB_RUN_ATTEMPT is {attempt!r}, not a number; run this inside GitHub Actions")
        return cls(output=Path(env["GITHUB_OUTPUT"]) if env.get("GITHUB_OUTPUT") else None,
                   summary=Path(env["GITHUB_STEP_SUMMARY"]) if env.get("GITHUB_STEP_SUMMARY") else None,
                   run_attempt=int(attempt), run_id=env.get("GITHUB_RUN_ID", "local"),
                   repository=env.get("GITHUB_REPOSITORY", ""), job=env.get("GITHUB_JOB", "bisect"),
                   server_url=env.get("GITHUB_SERVER_URL", "https://github.com"))

    @property
    def run_url(self) -> str | None:
        if not self.repository or self.run_id == "local":
            return None
        return f"{self.server_url}/{self.repository}/actions/runs/{self.run_id}"

    def check_files(self) -> None:
        """Refuse, before anything runs, an output or summary file that cannot be written: the
        step's answer would be lost after the bisection (GitHub makes both files; one that cannot
        be opened is a broken runner or a wrong variable)."""
        for name, path in (("GITHUB_OUTPUT", self.output), ("GITHUB_STEP_SUMMARY", self.summary)):
            if path is not None:
                self._append(name, path, "")

    def set_outputs(self, values: Mapping[str, str]) -> None:
        """Append `name<<DELIMITER` blocks to $GITHUB_OUTPUT (a value may hold any line but the delimiter)."""
        if self.output is None:
            return
        self._append("GITHUB_OUTPUT", self.output, "".join(
            f"{name}<<{(delimiter := f'EOF_{secrets.token_hex(8)}')}\n{value}\n{delimiter}\n"
            for name, value in values.items()))

    def add_summary(self, markdown: str) -> None:
        if self.summary is None:
            return
        if len(markdown) > SUMMARY_LIMIT:
            markdown = markdown[:SUMMARY_LIMIT] + "\n\n(cut at GitHub's summary limit: the session holds the rest)\n"
        self._append("GITHUB_STEP_SUMMARY", self.summary, markdown + "\n")

    @staticmethod
    def _append(name: str, path: Path, text: str) -> None:
        try:
            with path.open("a", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            raise InfrastructureError(f"{name} names {path}, which cannot be written ({exc.strerror}); run this "
                                      f"step inside GitHub Actions, or point {name} at a writable file") from None


@dataclass(frozen=True)
class BisectInputs:
    """The action's inputs for the bisection (strings as GitHub hands them; empty means not given)."""

    good: str
    bad: str
    repo: str = "."
    recipe: str = ""
    command: str = ""
    executor: str = "docker"
    devices: str = ""
    verdict_store: str = ""
    args: str = ""  # more `bisect-npu run` options, split as a shell would, run as an argument list
    matrix: str = ""  # the job's matrix values as GitHub's toJSON(matrix) gives them ("" or "null": none)

    def key(self) -> dict[str, object]:
        """What makes a bisection this one: the two legs of one job's matrix differ here, so they
        never share a session (a retried leg resumes its own)."""
        try:
            matrix = json.loads(self.matrix) if self.matrix.strip() else None
        except json.JSONDecodeError:
            matrix = self.matrix
        return {"good": self.good, "bad": self.bad, "repo": self.repo, "recipe": self.recipe,
                "command": self.command, "executor": self.executor, "devices": self.devices, "args": self.args,
                "verdict_store": self.verdict_store, "matrix": matrix}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()[:12]


INPUTS_FILE = "ci-inputs.json"  # in a CI session: the inputs it was started for (a retry checks them)


def session_for(actions: Actions, given: str | None, inputs: BisectInputs | None = None) -> Path:
    """The job's session directory: the one given, else one per repository, run, job and inputs
    (ends, command or recipe, executor, matrix values) under the cache root, which a retried
    attempt of the job on this runner finds again."""
    if given:
        return Path(given).resolve()
    repository, job = (re.sub(r"[^A-Za-z0-9._-]", "_", name) for name in (actions.repository or "local", actions.job))
    leg = f"-{inputs.digest()}" if inputs is not None else ""
    return cache_root() / "ci-sessions" / repository / f"{actions.run_id}-{job}{leg}"


def _check_resumed_inputs(inputs: BisectInputs, session: Path) -> None:
    """A retry resumes only the session its own inputs started: another leg's (a session given by
    hand to two legs), or one started with other inputs, is refused."""
    kept = session / INPUTS_FILE
    if not kept.is_file():
        raise UsageError(f"session {session} holds no {INPUTS_FILE}: it was not started by this action's inputs; "
                         "give each matrix leg its own `session` (or leave it empty)")
    started = json.loads(kept.read_text())
    if started != inputs.key():
        differ = sorted(name for name in {*started, *inputs.key()} if started.get(name) != inputs.key().get(name))
        raise UsageError(f"session {session} was started for other inputs ({', '.join(differ)} differ): a retry "
                         "resumes only its own leg's session; give each matrix leg its own `session` (or leave it "
                         "empty)")


def bisect_argv(inputs: BisectInputs, session: Path, actions: Actions) -> list[str]:
    """`bisect-npu` arguments for this attempt: resume the session a failed attempt left (started
    for the same inputs), else run."""
    if actions.run_attempt > 1 and (session / JOURNAL_FILE).is_file():
        _check_resumed_inputs(inputs, session)
        return ["resume", "--session", str(session), "--json"]
    try:
        more = shlex.split(inputs.args)
    except ValueError as exc:
        raise UsageError(f"the `args` input {inputs.args!r} cannot be split ({exc}); check its quotes") from None
    nightly = "--nightly-case" in more  # the recipe comes from the case file
    if not inputs.bad or [bool(inputs.recipe), bool(inputs.command), nightly].count(True) != 1:
        raise UsageError("the action needs `bad` and one of `recipe`, `cmd` or `args: --nightly-case CASE`")
    argv = ["run", "--repo", inputs.repo, "--good", inputs.good or LAST_GOOD, "--bad", inputs.bad,
            "--executor", inputs.executor, "--session", str(session), "--json"]
    argv += ["--recipe", inputs.recipe] if inputs.recipe else ["--cmd", inputs.command] if inputs.command else []
    if inputs.devices:
        argv += ["--devices", inputs.devices]
    if inputs.verdict_store:
        argv += ["--verdict-store", inputs.verdict_store]
    return argv + more


def _refused(actions: Actions, session: Path, message: str) -> int:
    """An input error before bisect-npu ran: one line on stderr, the outputs and summary written anyway."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    actions.set_outputs({"status": "error", "exit-code": "2", "culprit": "", "culprit-title": "",
                         "session": str(session), "resumed": "false", "report": "", "report-json": "",
                         "reused": "0", "message": message})
    actions.add_summary(f"# bisect-npu: error\n\n{message}\n")
    return 2


def bisect_step(inputs: BisectInputs, actions: Actions, session_given: str | None = None) -> int:
    """Run (or resume) the bisection; summary and outputs written whatever the outcome (an input
    that cannot be used included). Returns the step's exit code: 0 for an answer, and for a bad
    end judged good when the good end was `last-good` (nothing regressed since); 2 for unusable
    inputs; else bisect-npu's own code."""
    actions.check_files()
    session = session_for(actions, session_given, inputs)
    try:
        argv = bisect_argv(inputs, session, actions)
    except UsageError as exc:
        return _refused(actions, session, str(exc))
    resumed = argv[0] == "resume"
    if not resumed:
        session.mkdir(parents=True, exist_ok=True)
        (session / INPUTS_FILE).write_text(json.dumps(inputs.key(), sort_keys=True) + "\n")
    print(f"bisect-npu {shlex.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "bisect_npu", *argv], stdout=subprocess.PIPE, text=True,
                          check=False)
    sys.stdout.write(done.stdout)
    summary = _last_json_line(done.stdout) or {"status": "error", "exit_code": done.returncode,
                                               "message": f"bisect-npu exited {done.returncode} without a summary"}
    report_json = Path(summary["report_json"]) if summary.get("report_json") else None
    details = json.loads(report_json.read_text()) if report_json and report_json.is_file() else {}
    status = str(summary.get("status", "error"))
    no_regression = (status == "ends_wrong" and details.get("ends_wrong") == "bad"
                     and details.get("good_ref") == LAST_GOOD)
    actions.set_outputs({
        "status": "no-regression" if no_regression else status,
        "exit-code": str(summary.get("exit_code", done.returncode)),
        "culprit": summary.get("culprit") or "",
        "culprit-title": details.get("culprit_title") or "",
        "session": str(session),
        "resumed": "true" if resumed else "false",
        "report": summary.get("report") or "",
        "report-json": summary.get("report_json") or "",
        "reused": str(details.get("reused_verdicts", 0)),
    })
    report = Path(summary["report"]) if summary.get("report") else None
    if report is not None and report.is_file():
        actions.add_summary(report.read_text(encoding="utf-8"))
    else:
        actions.add_summary(f"# bisect-npu: {status}\n\n{summary.get('message', '')}\n\nSession: `{session}`")
    if status in ANSWERS or no_regression:
        return 0
    return done.returncode or 1


def _last_json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        return value if isinstance(value, dict) else None
    return None


@dataclass(frozen=True)
class IssueInputs:
    report_json: Path
    repository: str  # owner/name where the issues go
    label: str = "bisect-npu-regression"


def gh(*args: str, gh_path: str | None = None) -> str:
    """Run GitHub's CLI with an argument list; its stdout. GH_TOKEN comes from the step's environment."""
    program = gh_path or shutil.which("gh")
    if program is None:
        raise UsageError("the `gh` CLI is not on PATH; install GitHub CLI on the runner (https://cli.github.com)")
    done = subprocess.run([program, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InfrastructureError(f"gh {args[0]} {args[1] if len(args) > 1 else ''} failed ({done.returncode}): "
                                  f"{done.stderr.strip()[-300:]}")
    return done.stdout


def issue_step(inputs: IssueInputs, actions: Actions, workdir: Path) -> dict[str, str]:
    """Open the culprit's issue, or comment on the one that names it already (open or closed);
    nothing for a session without a culprit. Returns the outputs it set."""
    report = json.loads(inputs.report_json.read_text())
    culprit = report.get("culprit")
    if report.get("status") != "found" or not culprit:
        outputs = {"issue": "", "issue-action": "none"}
        actions.set_outputs(outputs)
        return outputs
    repo = ["--repo", inputs.repository]
    listed = json.loads(gh("issue", "list", *repo, "--label", inputs.label, "--state", "all", "--limit", "1000",
                           "--json", "number,url,state,body"))
    matching = sorted((issue for issue in listed if marker(culprit) in (issue.get("body") or "")),
                      key=lambda issue: (issue["state"] != "OPEN", -issue["number"]))
    markdown = Path(report["session"], "report.md").read_text(encoding="utf-8")
    run = f" ([run]({actions.run_url}))" if actions.run_url else ""
    body_file = workdir / "bisect-npu-issue.md"
    if matching:
        issue = matching[0]
        body_file.write_text(_cut(f"Found again{run}: the same culprit `{culprit[:12]}`.\n\n{markdown}"))
        gh("issue", "comment", str(issue["number"]), *repo, "--body-file", str(body_file))
        outputs = {"issue": issue["url"], "issue-action": "updated"}
    else:
        title = f"Regression: {culprit[:12]} {report.get('culprit_title') or ''}".strip()
        body_file.write_text(_cut(f"{marker(culprit)}\nFound by bisect-npu{run}.\n\n{markdown}"))
        gh("label", "create", inputs.label, *repo, "--force", "--color", "B60205",
           "--description", "A regression bisect-npu found (one issue per culprit)")
        url = gh("issue", "create", *repo, "--title", title[:250], "--label", inputs.label,
                 "--body-file", str(body_file)).strip().splitlines()[-1]
        outputs = {"issue": url, "issue-action": "created"}
    actions.set_outputs(outputs)
    return outputs


def _cut(text: str) -> str:
    """An issue body within GitHub's limit (the marker is on the first line: it stays)."""
    return text if len(text) <= BODY_LIMIT else text[:BODY_LIMIT] + "\n\n(cut: the job summary has the whole report)\n"
