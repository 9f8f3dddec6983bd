"""The report's "Settings" section: the smallest triggering difference, what each key is (needed,
not needed, needed together with others), and every configuration tried with its verdict and
evidence. Read from the settings journal alone (settings_journal.py), as the rest of the report
is read from the commit journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bisect_npu.recipe.settings import show
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    ConfigurationRetry,
    ConfigurationTrial,
    ReferenceRecord,
    SettingsEnd,
    SettingsEntry,
    SettingsHeader,
    read_settings,
)

SETTINGS_DIR = "settings"  # a commit session's settings search, run at its culprit


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:160]


def key_answers(header: SettingsHeader, end: SettingsEnd | None) -> list[dict[str, Any]]:
    """Per differing key: needed (alone), needed with the others of the trigger, or not needed."""
    trigger = set(end.trigger) if end is not None and end.status == "found" else set()
    names = [d.key for d in header.differences]
    rows = []
    for index, difference in enumerate(header.differences):
        if end is None or end.status != "found":
            answer = "not settled"
        elif index not in trigger:
            answer = "not needed"
        elif len(trigger) == 1:
            answer = "needed"
        else:
            others = ", ".join(names[i] for i in sorted(trigger - {index}))
            answer = f"needed; interacts with {others}"
        rows.append({"key": difference.key, "bad": difference.bad, "good": difference.good, "answer": answer})
    return rows


def needs_sentence(header: SettingsHeader, end: SettingsEnd | None) -> str | None:
    """"the symptom shows only with async_scheduling: true and repetition_penalty: 1.3"."""
    if end is None or end.status != "found":
        return None
    parts = [f"{header.differences[i].key.rpartition('.')[2]}: {show(header.differences[i].bad)}"
             for i in end.trigger]
    return "shows the symptom only with " + " and ".join(parts)


def _evidence(record: ConfigurationRecord, trials: list[ConfigurationTrial]) -> str:
    if record.host_failure is not None:
        return f"unresolved: {record.host_failure}"
    if record.stored is not None:
        return record.verdict.reason
    judged = [t for t in trials if t.outcome]
    if judged:
        bad = sum(t.outcome is not None and t.outcome.value == "bad" for t in judged)
        return f"{bad} of {len(judged)} trials bad"
    return record.verdict.reason


def configuration_rows(header: SettingsHeader, entries: list[SettingsEntry]) -> list[dict[str, Any]]:
    """One row per configuration in the order first tried; a noisy one's trials summed."""
    names = [d.key for d in header.differences]
    order: list[str] = []
    last: dict[str, ConfigurationRecord] = {}
    for entry in entries:
        if isinstance(entry, ConfigurationRecord):
            if entry.digest not in last:
                order.append(entry.digest)
            last[entry.digest] = entry
    rows = []
    for number, digest in enumerate(order, start=1):
        record = last[digest]
        trials = [e for e in entries if isinstance(e, ConfigurationTrial) and e.digest == digest]
        retries = [e for e in entries if isinstance(e, ConfigurationRetry) and e.digest == digest]
        at_bad = keys_at_bad(names, record.configuration, record.value_check)
        verdict = record.verdict.kind.value
        if header.mode == "noisy" and record.stored is None:
            judged = [t for t in trials if t.outcome]
            verdict = "bad" if any(t.outcome is not None and t.outcome.value == "bad" for t in judged) else verdict
        rows.append({"number": number, "keys_at_bad": at_bad, "digest": digest, "verdict": verdict,
                     "evidence": _evidence(record, trials), "build": record.build.how if record.build else "",
                     "trials": len([t for t in trials if t.outcome or t.observation]) or record.verdict.trials,
                     "retries": len(retries), "host_failures": sorted({r.cause for r in retries}),
                     "unresolved": record.host_failure})
    return rows


def keys_at_bad(names: list[str], configuration: list[int], value_check: str | None = None) -> str:
    """A configuration as the report names it: its keys at their bad value."""
    keys = set(configuration)
    if value_check:
        return f"the trigger, with {value_check}"
    if not keys:
        return "none (the good variant)"
    if len(keys) == len(names):
        return "all (the bad case)"
    return ", ".join(names[i] for i in sorted(keys))


def retry_rows(header: SettingsHeader, entries: list[SettingsEntry]) -> list[dict[str, Any]]:
    """Every failed attempt of a configuration's run on the host, in order (a commit session's
    `retry` records, keyed by configuration)."""
    names = [d.key for d in header.differences]
    return [{"keys_at_bad": keys_at_bad(names, e.configuration), "digest": e.digest, "reference": e.reference,
             "case_id": e.case_id, "trial": e.trial, "attempt": e.attempt, "kind": e.kind, "cause": e.cause,
             "log": e.log, "stage": e.stage} for e in entries if isinstance(e, ConfigurationRetry)]


def settings_markdown(session_dir: Path, after_commit_search: bool = False) -> str | None:
    """The section, or None where the directory holds no settings search."""
    read = read_settings(session_dir)
    if read is None:
        return None
    header, entries = read
    end = next((e for e in entries if isinstance(e, SettingsEnd)), None)
    lines = ["## Settings", ""]
    at = f"`{header.commit[:12]}` {header.title}".rstrip()
    lines.append(f"A settings search at {at} ({'the culprit' if after_commit_search else header.ref}), "
                 f"{header.mode} mode, over {len(header.differences)} difference(s) between the recipe (bad) and "
                 f"the good variant ({', '.join(f'`{g}`' for g in header.good_given)}).")
    if header.reference_commit:
        runs = sum(isinstance(e, ReferenceRecord) for e in entries)
        lines.append(f"Each configuration is judged against its own output at the reference commit "
                     f"`{header.reference_commit[:12]}` ({header.reference_ref}), where it ran once "
                     f"({runs} reference run(s)).")
    lines.append("")
    if end is None:
        lines.append("The search has not finished yet.")
    elif end.status in ("ends_wrong", "unresolved"):
        lines.append(f"**No trigger**: {end.message}")
    else:
        trigger = [header.differences[i] for i in end.trigger]
        parts = ", ".join(f"`{d.key}: {show(d.bad)}`" for d in trigger)
        if len(trigger) == 1:
            tail = "The good variant with this value is bad, with its own value good."
        else:
            tail = ("The good variant with these values is bad, and good again as soon as any one of them is "
                    "set back to its own value: the keys act together.")
        lines.append(f"**Smallest triggering difference**: {parts}. {tail}")
        if after_commit_search and (sentence := needs_sentence(header, end)):
            lines += ["", f"The culprit {sentence}."]
    lines += ["", "| key | bad | good | answer |", "|---|---|---|---|"]
    for row in key_answers(header, end):
        lines.append(f"| `{row['key']}` | {_cell(show(row['bad']))} | {_cell(show(row['good']))} | {row['answer']} |")
    lines += ["", "| # | keys at their bad value | verdict | evidence | build |", "|---:|---|---|---|---|"]
    for row in configuration_rows(header, entries):
        lines.append(f"| {row['number']} | {_cell(row['keys_at_bad'])} | **{row['verdict']}** | "
                     f"{_cell(row['evidence'])} | {row['build']} |")
    retries = retry_rows(header, entries)
    if retries:
        lines += ["", f"Failed on the host and retried ({len(retries)} attempt(s), none judged):", ""]
        for row in retries:
            where = " at the reference commit" if row["reference"] else ""
            lines.append(f"- {row['keys_at_bad']}{where}, attempt {row['attempt']}: retried: {row['cause']} "
                         f"(log `{row['log']}`)")
    lines.append("")
    return "\n".join(lines)


def settings_json(session_dir: Path) -> dict[str, Any] | None:
    read = read_settings(session_dir)
    if read is None:
        return None
    header, entries = read
    end = next((e for e in entries if isinstance(e, SettingsEnd)), None)
    return {
        "commit": header.commit,
        "reference_commit": header.reference_commit,
        "mode": header.mode,
        "status": end.status if end is not None else "running",
        "message": end.message if end is not None else None,
        "trigger": [header.differences[i].key for i in end.trigger] if end is not None else [],
        "keys": key_answers(header, end),
        "configurations": configuration_rows(header, entries),
        "retries": retry_rows(header, entries),
    }


def settings_report_markdown(session_dir: Path) -> str | None:
    """The report of a settings search's own session (no commit journal beside it), else None."""
    if (session_dir / "journal.jsonl").is_file():
        return None
    markdown = settings_markdown(session_dir)
    return None if markdown is None else f"# Settings search\n\n{markdown.removeprefix('## Settings').lstrip()}"


def write_settings_reports(session_dir: Path) -> tuple[Path, Path]:
    """report.md and report.json of a settings search's own session."""
    markdown = settings_report_markdown(session_dir)
    figures = settings_json(session_dir)
    assert markdown is not None and figures is not None
    md_path, json_path = session_dir / "report.md", session_dir / "report.json"
    md_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(json.dumps(figures, indent=2, default=str), encoding="utf-8")
    return md_path, json_path
