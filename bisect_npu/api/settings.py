"""`search_settings`: which setting breaks it, at one commit (delta debugging over the keys a good
variant differs in); what `bisect-npu settings` runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bisect_npu.defaults import TRIAL_TIMEOUT_S
from bisect_npu.errors import UsageError


@dataclass(frozen=True)
class SettingsOutcome:
    """How a settings search ended: `status` and `exit_code` (0 with a trigger, 4 when the recipe
    is not bad or the good variant not good there), the trigger's keys, the configurations run,
    and the reports (the `after` session's, which gains the Settings section, when there is one)."""

    status: Literal["found", "ends_wrong"]
    exit_code: int
    message: str
    trigger: list[str]
    configurations: int
    session_dir: Path
    report: Path
    report_json: Path


def search_settings(*, repo: str | None = None, ref: str | None = None, recipe: str | None = None,
                    good_set: Sequence[str] = (), good_recipe: str | None = None, vary: Sequence[str] = (),
                    mode: Literal["exact", "noisy"] | None = None, confidence: float | None = None,
                    executor: Literal["local", "docker", "ray"] = "local", devices: str | None = None,
                    dep_repos: Sequence[str] = (), timeout_s: float = TRIAL_TIMEOUT_S,
                    session_dir: str | Path | None = None, after: str | Path | None = None,
                    verdict_store: str | Path | None = None, no_verdict_store: bool = False,
                    reference_at: str | None = None,
                    on_session: Callable[[Path], None] | None = None) -> SettingsOutcome:
    """Find the smallest set of settings that turns the good variant bad at `ref`: `recipe` is the
    bad case, `good_set` (KEY=VALUE), `good_recipe` or `vary` (KEY=V1,V2,...) give the good variant.
    `after`: a finished commit session, whose culprit, repository and recipe stand for those not
    given, whose settings/ holds the search and whose report gains its section. `reference_at`: a
    commit where the case is good, against whose run of each configuration that configuration is
    judged (a recipe compared with the good end's output; with `after`, where the keys need one, the
    default is that session's good end). `session_dir`
    holding a settings search continues it. `on_session` is called with the search's directory
    before anything runs."""
    from bisect_npu.execute.ascend import parse_devices
    from bisect_npu.journal import DEFAULT_ROOT, new_session_dir
    from bisect_npu.orchestration.preflight import RAY_REFUSED
    from bisect_npu.orchestration.settings import SettingsRequest, SettingsSearch, with_session
    from bisect_npu.paths import default_verdict_store
    from bisect_npu.report.settings import SETTINGS_DIR, write_settings_reports

    if executor == "ray":
        raise UsageError(RAY_REFUSED)
    if verdict_store is not None and no_verdict_store:
        raise UsageError("verdict_store and no_verdict_store contradict each other; give one")
    after_dir = Path(after).resolve() if after is not None else None
    request = with_session(SettingsRequest(
        repo=repo, recipe=recipe, ref=ref, good_set=tuple(good_set), good_recipe=good_recipe, vary=tuple(vary),
        mode=mode, confidence=confidence, executor=executor,
        devices=parse_devices(devices) if devices is not None else [], dep_repos=tuple(dep_repos),
        timeout_s=timeout_s, after_session=after_dir, reference_at=reference_at))
    if after_dir is not None:
        session_dir = session_dir or after_dir / SETTINGS_DIR
    store = None if no_verdict_store else str(Path(verdict_store or default_verdict_store()).resolve())
    directory = Path(session_dir or new_session_dir(DEFAULT_ROOT)).resolve()
    if on_session is not None:
        on_session(directory)
    request = dataclasses.replace(request, verdict_store=store)
    search = SettingsSearch.start(request, directory)
    try:
        result = search.run()
    finally:
        search.close()
    md_path, json_path = write_settings_reports(directory)
    if after_dir is not None:
        from bisect_npu.report import write_reports

        md_path, json_path = write_reports(after_dir)
    return SettingsOutcome(result.status, result.exit_code, result.message, [d.key for d in result.trigger],
                          result.configurations, directory, md_path, json_path)
