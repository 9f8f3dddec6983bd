"""Align a candidate record with a reference record, stage by stage, case by case.

The field method as one call: rendered chat template -> prompt token ids -> forward pass (the layer
dumps, first divergent module) -> effective sampler parameters -> text; the first stage that
differs is where the drift enters (`oracle.stages`). Before comparing, the two records must be
comparable: the same cases, the same model and tokenizer (the identity each probe read), and
dumps of the same modules, or, for a vLLM record against a transformers one, dumps the module map
lines up (`line_up`). Anything else is a usage error naming the cause and the next step.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_npu.alignment.line_up import LineUp, line_up, write_views
from bisect_npu.alignment.module_map import TRANSFORMERS, VLLM
from bisect_npu.alignment.record import Record
from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import LogitsConfig, StagesConfig
from bisect_npu.oracle.dumps.compare import open_dump
from bisect_npu.oracle.stages import judge_stages

ALIGNED_EXIT, DIVERGED_EXIT = 0, 1


@dataclass(frozen=True)
class CaseAlignment:
    case_id: str
    verdict: Verdict
    lined_up: LineUp | None = None

    @property
    def first_stage(self) -> str | None:
        stage = self.verdict.figures.get("first_differing_stage")
        return str(stage) if stage else None

    @property
    def first_module(self) -> str | None:
        forward = self.verdict.figures.get("stages", {}).get("forward", {})
        first = forward.get("first_divergent") if isinstance(forward, dict) else None
        return str(first.get("module") or first.get("name")) if isinstance(first, dict) else None

    @property
    def first_vllm_module(self) -> str | None:
        """The vLLM module the first divergent one was lined up from, where the engines differ."""
        first = self.first_module
        return self.lined_up.vllm_module(first) if first and self.lined_up else None


@dataclass(frozen=True)
class Alignment:
    """The answer of `align`: each case's stage verdict, and where each record ran."""

    reference: Record
    candidate: Record
    cases: list[CaseAlignment]

    @property
    def aligned(self) -> bool:
        return all(case.verdict.kind != VerdictKind.BAD for case in self.cases)

    @property
    def first(self) -> CaseAlignment | None:
        """The first case that diverges."""
        return next((case for case in self.cases if case.verdict.kind == VerdictKind.BAD), None)

    @property
    def exit_code(self) -> int:
        return ALIGNED_EXIT if self.aligned else DIVERGED_EXIT

    def summary(self) -> str:
        first = self.first
        if first is None:
            return f"aligned: every compared stage of {len(self.cases)} case(s) matches the reference"
        module = f", first divergent module {first.first_module}" if first.first_module else ""
        if first.first_vllm_module:
            module += f" (vLLM's {first.first_vllm_module})"
        return f"diverged: case {first.case_id}, first differing stage {first.first_stage}{module}"

    def to_dict(self) -> dict[str, Any]:
        def side(record: Record) -> dict[str, Any]:
            keys = ("recipe", "backend", "device", "dtype", "versions", "model_identity", "commit")
            return {"path": str(record.path), **{key: record.manifest.get(key) for key in keys}}

        first = self.first
        return {"aligned": self.aligned, "summary": self.summary(), "exit_code": self.exit_code,
                "first_case": first.case_id if first else None, "first_stage": first.first_stage if first else None,
                "first_module": first.first_module if first else None,
                "first_vllm_module": first.first_vllm_module if first else None,
                "reference": side(self.reference), "candidate": side(self.candidate),
                "cases": [{"case_id": case.case_id, **case.verdict.model_dump(mode="json"),
                           **({"lined_up": case.lined_up.to_dict()} if case.lined_up else {})}
                          for case in self.cases]}

    def to_markdown(self) -> str:
        lines = ["# Alignment", "", f"**{self.summary()}**", "",
                 "| | record | ran on |", "|---|---|---|",
                 f"| reference | `{self.reference.path}` ({self.reference.recipe}) | {self.reference.where()} |",
                 f"| candidate | `{self.candidate.path}` ({self.candidate.recipe}) | {self.candidate.where()} |", ""]
        for case in self.cases:
            lines += [f"## Case `{case.case_id}`: {case.verdict.kind.value}", "", case.verdict.reason, "",
                      "| stage | matches | evidence |", "|---|---|---|"]
            for name, figures in case.verdict.figures.get("stages", {}).items():
                lines.append(f"| {name} | {'yes' if figures.get('matches') else '**no**'} | {_evidence(figures)} |")
            forward = case.verdict.figures.get("stages", {}).get("forward")
            if isinstance(forward, dict) and len(forward.get("layers") or []) >= 2:
                lines += ["", *layer_chart(case.case_id, forward["layers"])]
            skipped = case.verdict.figures.get("skipped_stages") or []
            if skipped:
                lines += ["", "Not recorded on both sides: " + ", ".join(skipped)]
            if case.lined_up is not None:
                lines += ["", "Forward pass lined up: " + case.lined_up.summary() + "."]
                if case.first_vllm_module:
                    lines += ["", f"`{case.first_module}` is vLLM's `{case.first_vllm_module}`."]
            lines.append("")
        return "\n".join(lines)


def layer_chart(case_id: str, layers: list[dict[str, Any]]) -> list[str]:
    """Each layer's error against its noise line, as the run report charts its tested commits: the bars are
    the worst output's cosine distance (log10), the line what the pair's noise allows it; drift enters at
    the first bar above the line."""
    def log10(value: float) -> str:
        return f"{math.log10(max(value, 1e-12)):.2f}"

    above = next((item for item in layers if item["distance"] > item["line"]), None)
    enters = (f"drift enters at layer {above['layer']} (`{above['tensor']}`)" if above is not None
              else "no layer above its noise line")
    return [f"Layer by layer, case `{case_id}`: each layer's worst output, its cosine distance (bars, log10) "
            f"against the distance its noise line allows (line); {enters}.", "", "```mermaid", "xychart-beta",
            f'    title "case {case_id}: log10 cosine distance per layer (bars) and its noise line"',
            "    x-axis [" + ", ".join(f'"{item["layer"]}"' for item in layers) + "]",
            '    y-axis "log10 cosine distance"',
            "    bar [" + ", ".join(log10(item["distance"]) for item in layers) + "]",
            "    line [" + ", ".join(log10(item["line"]) for item in layers) + "]", "```"]


def _evidence(figures: dict[str, Any]) -> str:
    if "first_divergent" in figures:
        first = figures["first_divergent"]
        return f"`{first.get('module') or first.get('name')}`: {first.get('problem')} ({first.get('rule')} rule)"
    if "differing" in figures:
        return "; ".join(f"{key}: candidate {value['candidate']!r}, reference {value['reference']!r}"
                         for key, value in figures["differing"].items())
    if figures.get("first_difference") is not None:
        said = f"first difference at {figures['first_difference']}"
        if "candidate_excerpt" in figures:
            said += (f": candidate `{figures['candidate_excerpt']!r}`, reference "
                     f"`{figures['reference_excerpt']!r}`")
        else:  # token ids: their lengths say which side ran on
            said += f" (candidate {figures.get('length')} ids, reference {figures.get('reference_length')})"
        return said
    if "worst_cosine" in figures:
        return f"{figures.get('tensors_compared')} tensors, worst cosine {figures['worst_cosine']}"
    return "identical"


_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers")


def _sizes(identity: dict[str, Any]) -> str:
    return ", ".join(f"{key} {identity.get(key)}" for key in _SIZES)


def _modules(dump: str) -> set[str]:
    return {entry.module or entry.name for entries in open_dump(dump).values() for entry in entries}


def engine(record: Record) -> str:
    """Whose module names a record's dumps carry: vLLM's, or transformers' (its own backend and the
    demo engine, which names its modules as transformers does)."""
    return VLLM if record.manifest.get("backend") == VLLM else TRANSFORMERS


def _lined_up(case_id: str, reference: Record, candidate: Record, ref_dump: str, cand_dump: str) -> LineUp | None:
    """The case's dumps lined up across engines, or where their names differ; a usage error when they share
    nothing."""
    lined = line_up(ref_dump, cand_dump, engine(reference), engine(candidate))
    if lined is None or (not lined.across_engines and (lined.only_reference or lined.only_candidate)):
        return None
    if not lined.points:
        raise UsageError(f"the dumps of case {case_id} share no module once lined up (only in the reference: "
                         f"{lined.to_dict()['only_in_reference'][:3]}; only in the candidate: "
                         f"{lined.to_dict()['only_in_candidate'][:3]}; {lined.unknown_line() or 'no unknown module'})"
                         "; record both with the same capture.layers")
    return lined if lined.across_engines or lined.renamed else None


def check_comparable(reference: Record, candidate: Record) -> dict[str, LineUp]:
    """Refuse two records that cannot be aligned: other cases, model, tokenizer, or dumped modules.

    Returns each case's lined-up dumps where they must be rewritten to be compared: a vLLM record
    against a transformers one, or two records whose module classes differ (vllm-ascend's own)."""
    if reference.cases_digest != candidate.cases_digest:
        raise UsageError(f"the records ran different cases (reference {reference.path}: recipe {reference.recipe}; "
                         f"candidate {candidate.path}: recipe {candidate.recipe}); record both from recipes with "
                         "the same cases")
    ref_id, cand_id = reference.identity, candidate.identity
    if ref_id and cand_id and any(ref_id.get(k) != cand_id.get(k) for k in _SIZES):
        raise UsageError(f"the records ran different models (reference: {_sizes(ref_id)}; candidate: "
                         f"{_sizes(cand_id)}); record the reference with the candidate's model")
    if ref_id and cand_id and ref_id.get("tokenizer") != cand_id.get("tokenizer"):
        raise UsageError(f"the records used different tokenizers (vocabulary digest {ref_id.get('tokenizer')} vs "
                         f"{cand_id.get('tokenizer')}); record the reference with the candidate's tokenizer")
    lined_up: dict[str, LineUp] = {}
    across = engine(reference) != engine(candidate)
    for case_id, ref_obs in reference.observations.items():
        cand_obs = candidate.observations.get(case_id)
        if cand_obs is None or not ref_obs.logits_dump or not cand_obs.logits_dump:
            continue
        ref_modules, cand_modules = _modules(ref_obs.logits_dump), _modules(cand_obs.logits_dump)
        if ref_modules == cand_modules and not across:
            continue
        lined = _lined_up(case_id, reference, candidate, ref_obs.logits_dump, cand_obs.logits_dump)
        if lined is not None:
            lined_up[case_id] = lined
        elif ref_modules != cand_modules:
            only_ref = sorted(ref_modules - cand_modules)[:3]
            only_cand = sorted(cand_modules - ref_modules)[:3]
            raise UsageError(f"the dumps of case {case_id} name different modules (only in the reference: "
                             f"{only_ref}; only in the candidate: {only_cand}): a different model, or other "
                             "capture.layers patterns; record both with the same capture.layers")
    return lined_up


def _with_forward(observation: Observation, dump: Path) -> Observation:
    """The observation with its forward pass read from `dump` (a lined-up view)."""
    copy = observation.model_copy(deep=True)
    copy.logits_dump = str(dump)
    stages = copy.extra.get("stages")
    if isinstance(stages, dict):
        stages["forward"] = str(dump)
    return copy


def align_records(reference: Record, candidate: Record, stages: StagesConfig | None = None,
                  logits: LogitsConfig | None = None) -> Alignment:
    """Each case's first differing stage (and module), the candidate against the reference."""
    lined_up = check_comparable(reference, candidate)
    stages_cfg, logits_cfg = stages or StagesConfig(), logits or LogitsConfig()
    cases: list[CaseAlignment] = []
    with tempfile.TemporaryDirectory(prefix="bisect-npu-line-up-") as scratch:
        for case_id, ref_obs in reference.observations.items():
            cand_obs = candidate.observations.get(case_id)
            if cand_obs is None:
                continue
            lined = lined_up.get(case_id)
            if lined is not None:
                views = Path(scratch) / f"case-{len(cases)}"
                ref_view, cand_view = write_views(lined, views / "reference", views / "candidate")
                ref_obs, cand_obs = _with_forward(ref_obs, ref_view), _with_forward(cand_obs, cand_view)
            cases.append(CaseAlignment(case_id, judge_stages(cand_obs, ref_obs, stages_cfg, logits_cfg), lined))
    return Alignment(reference, candidate, cases)
