"""The case a report is about, as a maintainer reads it first: the model, the engine's arguments,
each request with its sampling as sent, and the oracle's rule in words.

The recipe is read from where the session found it; a recipe changed since (its digest differs)
is shown with a warning, and a recipe that is gone leaves only what the journal holds.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.oracle.config import OracleConfig
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe, ReferenceSpec
from bisect_npu.report.view import SessionView

PROMPT_CHARS = 300  # of a request's prompt shown in the report


@dataclass
class RequestView:
    """One request of the case: its id, the prompt (or the chat's last user message) and the
    sampling parameters sent (unset ones are the engine's defaults)."""

    id: str
    prompt: str
    chat: bool
    sampling: dict[str, Any]


@dataclass
class CaseView:
    recipe: str | None = None
    description: str = ""
    model: str | None = None
    dtype: str | None = None
    backend: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    server_flags: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    requests: list[RequestView] = field(default_factory=list)
    harness: str | None = None  # accuracy: the harness and the data it scores
    rules: list[str] = field(default_factory=list)  # the oracle's rule in words, one per judge
    changed: bool = False  # the recipe file differs from the one the session ran
    missing: bool = False  # the recipe file is gone: only the journal's facts are shown


def recipe_of(view: SessionView) -> Recipe | None:
    """The session's recipe as it is now (None when it has none or it cannot be read)."""
    name = view.request.judge.recipe
    if not name:
        return None
    try:
        return load_recipe(name)
    except UsageError:
        return None


def case_view(view: SessionView) -> CaseView:
    request = view.request
    judge = request.judge
    if judge.unit_tests:
        return CaseView(rules=[f"the unit tests {', '.join(f'`{t}`' for t in judge.unit_tests)} decide: all "
                               "passing is good, one failing is bad"])
    if judge.command:
        return CaseView(rules=[f"the command `{shlex.join(judge.command)}` decides: exit 0 good, 125 skip, "
                               "1-127 bad (as `git bisect run` reads it)"])
    recipe = recipe_of(view)
    if recipe is None:
        return CaseView(recipe=Path(judge.recipe).name if judge.recipe else None, missing=bool(judge.recipe))
    case = CaseView(recipe=recipe.name, description=recipe.description, model=portable_model(recipe.model.path),
                    dtype=recipe.model.dtype, backend=recipe.engine.backend, engine_args=dict(recipe.engine.args),
                    server_flags=list(recipe.engine.server_flags), environment=dict(recipe.environment),
                    changed=view.header.recipe_digest is not None and recipe.digest() != view.header.recipe_digest)
    for spec in recipe.cases if recipe.accuracy is None else []:  # an accuracy case's requests are the dataset's
        chat = spec.messages is not None
        text = spec.prompt or ""
        if spec.messages:
            users = [m.content for m in spec.messages if m.role == "user"]
            text = users[-1] if users else spec.messages[-1].content
        case.requests.append(RequestView(spec.id, _excerpt(text), chat,
                                         spec.sampling.model_dump(exclude_none=True)))
    acc = recipe.accuracy
    if acc is not None:
        what = acc.lm_eval.task if acc.lm_eval else acc.aisbench.dataset_conf if acc.aisbench else ""
        case.harness = (f"{acc.harness}{f' ({what})' if what else ''} on `{Path(acc.dataset).name}`"
                        f"{f', {acc.limit} samples' if acc.limit else ''}")
        case.requests.append(RequestView("every dataset sample", "", False, acc.sampling.model_dump(exclude_none=True)))
    case.rules = oracle_rules(recipe.oracle, recipe.reference, recipe)
    return case


def portable_model(path: str) -> str:
    """The model as another host names it: a directory's last part (the weights' name), a hub id as is."""
    return Path(path).name if path.startswith(("/", "~")) else path


def _excerpt(text: str) -> str:
    return text if len(text) <= PROMPT_CHARS else text[:PROMPT_CHARS - 1] + "…"


def _reference_words(reference: ReferenceSpec) -> str:
    if reference.kind == "golden":
        return "a golden observation kept with the recipe"
    if reference.kind == "none":
        return "no reference"
    return "the good end's own output"


def oracle_rules(oracle: OracleConfig, reference: ReferenceSpec, recipe: Recipe) -> list[str]:
    """Each judge's rule in one sentence (a step is bad when any of them says bad)."""
    against = _reference_words(reference)
    rules = []
    for kind in oracle.kinds:
        if kind == "repetition":
            rep = oracle.repetition
            rule = (f"bad when the output loops: a run of {rep.min_pattern_size}-{rep.max_pattern_size} tokens "
                    f"repeated at least {rep.min_count} times, covering at least {rep.min_loop_tokens} tokens")
            if rep.require_length_finish:
                rule += ", in an output that ran out of tokens"
            rules.append(rule)
        elif kind == "tokens":
            tok = oracle.tokens
            span = f"the first {tok.compare_tokens} output tokens" if tok.compare_tokens else "the output tokens"
            rules.append(f"bad when fewer than {tok.min_match_rate:.0%} of {span} match {against}; a first "
                         "mismatch is a numerical tie, not bad, when the two tokens' logprob difference moved no more "
                         "than the rounding noise measured on the pair (bounded by both precisions) or "
                         f"{tok.tie_margin}")
        elif kind == "logits":
            lg = oracle.logits
            rules.append(f"bad when a dumped tensor diverges from {against}: cosine below {lg.min_cosine} (with a "
                         f"max absolute error above {lg.cosine_abs_floor}) or below {lg.min_cosine_always}, as "
                         "msprobe compares; the report names the first divergent one")
        elif kind == "stats":
            rules.append(f"judged over repeated trials: a sequential test at {oracle.stats.confidence:.0%} "
                         "between the good end's rate of bad trials and the bad end's")
        elif kind == "acceptance":
            rules.append(f"bad when speculative decoding accepts less than "
                         f"{oracle.acceptance.min_acceptance_rate:.0%} of the draft tokens")
        elif kind == "penalty":
            expected = ", ".join(f"{k}={v}" for k, v in oracle.penalty.expected.items())
            rules.append(f"bad when the sampling parameters the engine applied differ from {expected or 'those sent'}")
        elif kind == "stages":
            rules.append(f"bad at the first stage of {', '.join(oracle.stages.stages)} that differs from {against}")
        elif kind == "accuracy" and recipe.accuracy is not None:
            rules.append(_accuracy_rule(recipe))
        elif kind == "throughput" and oracle.throughput is not None:
            line = oracle.throughput
            base = f"{line.baseline} tokens/s" if line.baseline is not None else "the good end's"
            rules.append(f"bad when the output token throughput falls below {line.threshold:.0%} of {base}")
        elif kind == "command":
            rules.append("the command's exit status decides: 0 good, 125 skip, 1-127 bad")
    return rules


def _accuracy_rule(recipe: Recipe) -> str:
    acc = recipe.accuracy
    assert acc is not None
    what = "loop rate (a run that loops or runs out of tokens counts as wrong)" if acc.metric == "loop_rate" \
        else "accuracy"
    paired = f"bad when the {what} falls below the good end's, paired sample by sample"
    published = (f"bad when the {what} is below the published {acc.baseline} points less {acc.threshold}"
                 if acc.baseline is not None else "")
    rule = {"good_end": paired, "baseline": published, "both": f"{paired}, or {published}"}[acc.reference]
    return f"{rule} (a sequential test at {acc.confidence:.0%} confidence)"
