"""`search_settings`: which setting breaks it, at one commit (delta debugging over the keys a good
variant differs in); what `bisect-npu settings` runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.request import RunRequest, part_types


@dataclass(frozen=True)
class SettingsOutcome:
    """How a settings search ended: `status` and `exit_code` (0 with a trigger, 4 when the recipe
    is not bad or the good variant not good there, 3 when configurations the trigger rests on could
    not be judged for reasons of their own), the trigger's keys, the configurations run,
    and the reports (the `after` session's, which gains the Settings section, when there is one)."""

    status: Literal["found", "ends_wrong", "unresolved"]
    exit_code: int
    message: str
    trigger: list[str]
    configurations: int
    session_dir: Path
    report: Path
    report_json: Path


def search_settings(request: RunRequest | None = None, *, ref: str | None = None, good_set: Sequence[str] = (),
                    good_recipe: str | None = None, vary: Sequence[str] = (), after: str | Path | None = None,
                    reference_at: str | None = None, session_dir: str | Path | None = None,
                    no_verdict_store: bool = False, on_session: Callable[[Path], None] | None = None,
                    quiet: bool = False, live: bool = False, **fields: Any) -> SettingsOutcome:
    """Find the smallest set of settings that turns the good variant bad at `ref`: the recipe is
    the bad case, `good_set` (KEY=VALUE), `good_recipe` or `vary` (KEY=V1,V2,...) give the good
    variant. The runs are made under `request` (its bad end is `ref`) or a request of `fields` by
    name, as `bisect` takes them (`repo`, `recipe`, `executor`, `devices`, `timeout_s`,
    `base_image_map`, `verdict_store`, ...; without `verdict_store` the shared default store
    unless `no_verdict_store`): every executor option a commit search honours, this one does.
    `after`: a finished commit session, whose culprit, repository and recipe stand for those not
    given, whose settings/ holds the search and whose report gains its section. `reference_at`: a
    commit where the case is good, against whose run of each configuration that configuration is
    judged (a recipe compared with the good end's output; with `after`, where the keys need one, the
    default is that session's good end). `session_dir` holding a settings search continues it.
    `on_session` is called with the search's directory before anything runs. Progress lines go to
    stderr unless `quiet` (`live`: a terminal display, as `bisect`'s). Where the host's failures
    leave a configuration the answer needs unjudged (InfrastructureError, exit 5), the reports are
    written before it is raised: they show every failed attempt."""
    from bisect_npu.api.bisection import progress_for
    from bisect_npu.journal import DEFAULT_ROOT, new_session_dir
    from bisect_npu.orchestration.opening.preflight import RAY_REFUSED
    from bisect_npu.orchestration.settings_search import SettingsQuestion, settings_request
    from bisect_npu.orchestration.settings_session import SettingsSearch
    from bisect_npu.paths import default_verdict_store
    from bisect_npu.report.settings import SETTINGS_DIR, write_settings_reports

    if request is not None:
        if fields:
            raise UsageError(f"give the request or its fields by name, not both ({', '.join(sorted(fields))})")
        fields = {name: getattr(getattr(request, part), name) for part, model in part_types(type(request))
                  for name in model.model_fields if part != "range" or name == "repo"}
        ref = ref or request.range.bad
    elif "verdict_store" in fields and no_verdict_store:
        raise UsageError("verdict_store and no_verdict_store contradict each other; give one")
    elif not no_verdict_store:
        fields.setdefault("verdict_store", str(default_verdict_store()))
    if fields.get("executor") == "ray":
        raise UsageError(RAY_REFUSED)
    after_dir = Path(after).resolve() if after is not None else None
    question, asked = settings_request(SettingsQuestion(
        ref=ref, good_set=tuple(good_set), good_recipe=good_recipe, vary=tuple(vary), after_session=after_dir,
        reference_at=reference_at), fields)
    if asked.store.verdict_store is not None:
        asked.store.verdict_store = str(Path(asked.store.verdict_store).resolve())
    if after_dir is not None:
        session_dir = session_dir or after_dir / SETTINGS_DIR
    directory = Path(session_dir or new_session_dir(DEFAULT_ROOT)).resolve()
    if on_session is not None:
        on_session(directory)
    progress = progress_for(quiet, live)
    stopped_on_the_host = False
    try:
        search = SettingsSearch.start(question, asked, directory, progress)
        try:
            result = search.run()
        except InfrastructureError:
            stopped_on_the_host = True
            raise
        finally:
            search.close()
            if stopped_on_the_host:
                write_settings_reports(directory)
    finally:
        progress.close()
    md_path, json_path = write_settings_reports(directory)
    if after_dir is not None:
        from bisect_npu.report import write_reports

        md_path, json_path = write_reports(after_dir)
    return SettingsOutcome(result.status, result.exit_code, result.message, [d.key for d in result.trigger],
                          result.configurations, directory, md_path, json_path)
