"""A session's reports: Markdown for the GitHub issue a vllm-ascend maintainer receives (in the
order they read it: the verdict, the case, bad against good, the culprit, the fix, the host, how
to reproduce, then the search itself folded away), and JSON for CI."""

from __future__ import annotations

import json
import os
import platform
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jinja2

from bisect_npu import __version__
from bisect_npu.fix_proposals import some_branches
from bisect_npu.level import held_of, scope_of
from bisect_npu.observations import to_jsonable
from bisect_npu.paths import cache_root
from bisect_npu.report.accuracy import accuracy_view, chart_series
from bisect_npu.report.case import case_view
from bisect_npu.report.culprit import FILES_SHOWN, culprit_facts
from bisect_npu.report.evidence import evidence_summary, host_line, switch_lines
from bisect_npu.report.host import host_rows
from bisect_npu.report.nightly import nightly_section
from bisect_npu.report.outputs import first_divergent, output_pairs
from bisect_npu.report.reproduce import reproduce
from bisect_npu.report.settings import SETTINGS_DIR, settings_json, settings_markdown
from bisect_npu.report.view import SessionView, StepView, answer_of, build_counts, load_view, reused_count

TEMPLATES = Path(__file__).parent / "templates"


class _TemplateCodeCache(jinja2.FileSystemBytecodeCache):
    """The report templates' compiled code under the cache root, so that each `run`, `resume` and
    `report` does not compile them again (jinja2 checks each entry against its template's source).
    A cache root that cannot be written costs only the compile: the report is written anyway."""

    def __init__(self) -> None:
        super().__init__(directory=str(cache_root() / "report-templates"))

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            return

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            return


def _environment(session_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.ChainableUndefined, bytecode_cache=_TemplateCodeCache())
    env.filters["short"] = lambda sha: (sha or "")[:12]
    env.filters["some_branches"] = some_branches
    env.filters["shell_join"] = shlex.join  # a command as it would be typed again
    env.filters["cell"] = lambda text: str(text).replace("|", "\\|").replace("\n", " ")[:160]
    env.filters["yaml"] = lambda value: value if isinstance(value, str) else json.dumps(value)
    # Another session's directory as seen from this one's: no path of this machine in the page.
    env.filters["beside"] = lambda path: os.path.relpath(path, session_dir) if path else ""
    env.filters["unplaced"] = lambda text: str(text).replace(str(session_dir), "SESSION").replace(str(Path.home()), "~")
    return env


def step_reasons(steps: list[StepView]) -> list[tuple[StepView, str]]:
    """Each step with its reason, a reason said by an earlier step shortened to a pointer to it."""
    first: dict[str, int] = {}
    rows = []
    for step in steps:
        said = first.setdefault(step.reason, step.order)
        rows.append((step, step.reason if said == step.order else f"as step {said}"))
    return rows


def render_markdown(view: SessionView) -> str:
    nightly = nightly_section(view)
    env = _environment(view.session_dir)
    tail = env.get_template("nightly.md.j2").render(n=nightly, github=view.github) if nightly else ""
    return _main_report(view, env) + tail  # the nightly-shaped section beside our own, after it


def _main_report(view: SessionView, env: jinja2.Environment) -> str:
    answer = answer_of(view)
    found_by = answer.view if answer is not None else view  # the session whose commits the answer names
    return env.get_template("report.md.j2").render(
        v=view, r=view.range, q=view.request, cx=view.header.context,
        held=held_of(view.header.level), scope=scope_of(view.header.level), end=view.end, a=answer, av=found_by,
        a_held=held_of(found_by.header.level),
        chart=chart_series(view.steps), case=case_view(view), pairs=output_pairs(view),
        divergent=first_divergent(view), facts=culprit_facts(found_by), files_shown=FILES_SHOWN,
        repro=reproduce(view), host_rows=host_rows(view), tool_version=__version__,
        machine=f"{platform.node()} ({platform.system()} {platform.machine()}, Python {platform.python_version()})",
        build_counts=build_counts(view.steps), total_seconds=round(sum(s.seconds for s in view.steps), 1),
        reused=reused_count(view.steps), steps=step_reasons(view.steps),
        evidence=evidence_summary(found_by), host_line=host_line(view), switches=switch_lines(view.steps),
        settings=settings_markdown(view.session_dir / SETTINGS_DIR, after_commit_search=True),
        accuracy=accuracy_view(view),
    )


def session_status(view: SessionView) -> str:
    """found, narrowed, ends_wrong (the answer's, a finer level's included); crashed (a bug), stopped
    (an error or an interrupt); else running."""
    answer = answer_of(view)
    if answer is not None:
        return answer.status
    return view.stop.status if view.stop is not None else "running"


def render_json(view: SessionView) -> dict[str, Any]:
    """The session's report as JSON; its answer (culprit, status, message, range) is the one `run`
    printed, a finer level's where it descended (`answer_of`), and `level_culprit` this level's own."""
    answer = answer_of(view)
    found_by = answer.view if answer is not None else view
    end, own = found_by.end, view.end
    culprit = answer.culprit if answer is not None else None
    figures = end.figures if end is not None else None
    facts = culprit_facts(found_by)
    return {
        "tool_version": __version__,
        "session": str(view.session_dir),
        "status": session_status(view),
        # Why a session without an answer stopped, and the exit code it stopped with.
        "stopped": {"exit_code": view.stop.exit_code, "reason": view.stop.reason} if view.stop is not None else None,
        "culprit": culprit,
        "culprit_title": found_by.title_of(culprit) if culprit else None,
        "culprit_author_date": facts.author_date if facts is not None else None,
        "culprit_files": facts.files if facts is not None else None,
        "culprit_session": str(found_by.session_dir) if answer is not None and answer.finer else None,
        "level_culprit": own.culprit if own is not None else None,  # what this level's search ended at
        "range": [end.lo, end.hi] if end is not None and answer is not None and answer.status == "narrowed" else None,
        # Narrowed below the confidence asked: the commit the search leaned to (`range` holds the confidence).
        "best_guess": end.best_guess if end is not None and answer is not None and answer.status == "narrowed"
        else None,
        "message": answer.message if answer is not None and answer.message else None,
        "evidence": figures,
        # What the noisy figures' rates count: the search's "bad" runs, clean ones under --find-fix.
        "evidence_counts": (("runs without the symptom" if view.request.search.find_fix else "runs with the symptom")
                            if any(name.endswith("_rate") for name in figures or {}) else None),
        "prefetch_saved_s": own.prefetch_saved_s if own is not None else None,
        "ends_wrong": end.which if end is not None and answer is not None and answer.status == "ends_wrong" else None,
        "good": view.range.good, "bad": view.range.bad, "base": view.range.base,
        "good_ref": view.range.good_ref, "bad_ref": view.range.bad_ref,
        "merge_base_note": view.range.merge_base_note,
        "candidates": len(view.range.candidates),
        "steps": [{"index": s.index, "commit": s.commit, "title": s.title, "verdict": s.verdict,
                   "reason": s.reason, "seconds": s.seconds, "build": s.build_how, "trials": s.trials,
                   "figures": s.figures, "run_env": s.run_env, "compiled_changes": s.compiled_changes,
                   "retries": len(s.retries), "host_failures": s.retries,
                   "nodes": [node.model_dump(mode="json") for node in s.nodes]}
                  for s in view.steps],
        "host": view.header.context.host, "host_changes": view.header.host_changes,
        "fix": to_jsonable(view.fix), "fix_verify": to_jsonable(view.fix_verify),
        "level": view.range.kind, "package": view.range.package,
        "next_level": view.next_level.model_dump(mode="json") if view.next_level is not None else None,
        "dependency_moves": [move.model_dump(mode="json") for move in view.dependency_moves],
        "parent_session": view.header.parent_session,
        "versions": view.versions, "engine_starts": view.engine_starts, "search_told": view.told,
        "reused_verdicts": reused_count(view.steps), "verdict_store": view.request.store.verdict_store,
        "settings": settings_json(view.session_dir / SETTINGS_DIR),  # a settings search at the culprit
        "nightly": _nightly_json(view),
        "accuracy": _accuracy_json(view),
        "reproduce": reproduce(view).command,
    }


def _nightly_json(view: SessionView) -> dict[str, Any] | None:
    section = nightly_section(view)
    if section is None:
        return None
    return {**section, "steps": [{**step, "rows": [asdict(row) for row in step["rows"]]} for step in section["steps"]]}


def _accuracy_json(view: SessionView) -> dict[str, Any] | None:
    acc = accuracy_view(view)
    if acc is None:
        return None
    return {**acc, "rows": [{"index": s.index, "commit": s.commit, "verdict": s.verdict,
                             **{k: s.figures.get(k) for k in ("accuracy", "accuracy_low", "accuracy_high",
                                                              "samples_run", "samples_total", "sample_runs",
                                                              "rounds", "log_likelihood_ratio")}}
                            for s in acc["rows"]]}


def report_paths(session_dir: Path) -> tuple[Path, Path]:
    """Where a session's reports are: (markdown, json), beside the journal."""
    return session_dir / "report.md", session_dir / "report.json"


def write_reports(session_dir: Path) -> tuple[Path, Path]:
    """Render both formats next to the journal; returns (markdown path, json path)."""
    view = load_view(session_dir)
    md_path, json_path = report_paths(session_dir)
    md_path.write_text(render_markdown(view), encoding="utf-8")
    json_path.write_text(json.dumps(render_json(view), indent=2), encoding="utf-8")
    return md_path, json_path
