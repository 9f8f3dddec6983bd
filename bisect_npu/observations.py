"""The data every room shares: observations, verdicts, their timings and samples.

With `fix_proposals`, the shapes that cross room boundaries (docs/design/flow.md, "Data between the rooms").
The probe writes observations with the standard library; this module validates them on the host.
"""

from __future__ import annotations

import dataclasses
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bisect_npu.errors import UsageError, validation_problem

OBSERVATION_SCHEMA_VERSION = 1
# A token id as vocabularies have them: a whole number that fits the int32 arrays the oracles use
# (a JSON 10**30 would overflow them; `true` is not a token).
TokenId = Annotated[int, Field(strict=True, ge=0, lt=2**31)]
# What a trial that runs past --timeout says about its commit. Skip by default: a timeout is more
# often a slow host, a stuck download or a busy card than the regression, and a skip costs a step
# where a wrong bad verdict costs the answer; `bad` is for regressions that are hangs.
TimeoutIs = Literal["bad", "skip"]


class StrictModel(BaseModel):
    """A section of a file the user writes (a recipe, its oracle settings): an unknown key is an
    error naming it, never a setting silently ignored."""

    model_config = ConfigDict(extra="forbid")


class VerdictKind(StrEnum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


# The `git bisect run` protocol: the exit status a verdict stands for; a command's 1..127 all read
# bad, and above 127 the bisection aborts.
VERDICT_EXIT: dict[VerdictKind, int] = {VerdictKind.GOOD: 0, VerdictKind.BAD: 1, VerdictKind.SKIP: 125}
SKIP_EXIT = VERDICT_EXIT[VerdictKind.SKIP]
ABORT_ABOVE = 127


class Verdict(BaseModel):
    """What an oracle concluded about one commit (or one trial), and why."""

    model_config = ConfigDict(frozen=True)

    kind: VerdictKind
    reason: str
    figures: dict[str, Any] = Field(default_factory=dict)
    trials: int = 1


class Timings(BaseModel):
    load_s: float = 0.0
    generate_s: float = 0.0


class SampleOutcome(BaseModel):
    """One dataset sample's result in an accuracy evaluation (the `accuracy` oracle's input).

    ``correct`` is the share of the sample's runs that were correct: 0 or 1 for one run, a rate
    when a sampled evaluation repeats the sample (``runs`` > 1). The text excerpts are for the
    report's "samples that flipped at the culprit"; the statistics read only id, correct, runs.
    """

    model_config = ConfigDict(extra="allow")

    id: str = Field(..., min_length=1, description="the sample's id in its dataset, stable across commits")
    correct: float = Field(..., ge=0.0, le=1.0, allow_inf_nan=False,
                           description="share of the runs that were correct (0 or 1 for one run)")
    runs: int = Field(1, strict=True, ge=1, description="runs of this sample behind `correct`")
    prompt: str | None = Field(None, description="excerpt of the prompt, for the report")
    output: str | None = Field(None, description="excerpt of the (first) answer, for the report")
    target: str | None = Field(None, description="the reference answer, for the report")
    finish_reason: str | None = Field(None, description="how the (first) run ended: stop, length, ...")

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        """Datasets number their samples as often as they name them: 7 and "7" are one id."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @property
    def correct_runs(self) -> float:
        """Correct runs (a whole number when `correct` came from counts)."""
        return self.correct * self.runs


class Observation(BaseModel):
    """One probe run of one case and trial (written by `bisect_npu.probe`)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(OBSERVATION_SCHEMA_VERSION, strict=True, ge=1)
    commit: str = ""
    recipe: str = ""
    # The run digest of the recipe that ran it (`Recipe.run_digest`: what ran, not how it is judged;
    # "" where an older probe, or another writer, left it out).
    run_digest: str = ""
    case_id: str = "default"
    trial: int = 0
    seed: int | None = None
    prompt_token_ids: list[TokenId] = Field(default_factory=list)
    output_token_ids: list[TokenId] = Field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | None = None
    timings: Timings = Field(default_factory=Timings)
    sampling: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    # Per generated token: the top candidates as [[token_id, logprob], ...], best first.
    top_logprobs: list[list[tuple[TokenId, float]]] | None = None
    logits_dump: str | None = None
    # An accuracy evaluation (oracle kind `accuracy`): one outcome per dataset sample run in this
    # trial. None for every other kind; an observation written before this field reads as None.
    samples: list[SampleOutcome] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, version: int) -> int:
        if version > OBSERVATION_SCHEMA_VERSION:
            raise ValueError(f"schema {version} is newer than this bisect-npu reads ({OBSERVATION_SCHEMA_VERSION}); "
                             "upgrade bisect-npu or judge it with the version whose probe wrote it")
        return version

    @classmethod
    def load(cls, path: str | Path) -> Observation:
        """Read an observation file; a corrupt file is a BisectError naming it, never a trace."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise UsageError(f"observation file not found: {path}") from exc
        except IsADirectoryError as exc:
            raise UsageError(f"{path}: a directory, not an observation file") from exc
        except OSError as exc:
            raise UsageError(f"{path}: cannot read the observation ({exc.strerror})") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: not valid JSON ({exc}); the probe was probably interrupted") from exc
        except RecursionError as exc:
            raise UsageError(f"{path}: JSON nested too deeply to be an observation") from exc
        try:
            return cls.model_validate(raw)
        except RecursionError as exc:
            raise UsageError(f"{path}: JSON nested too deeply to be an observation") from exc
        except ValidationError as exc:
            field, problem = validation_problem(exc)
            raise UsageError(f"{path}: field {field!r}: {problem}") from exc


def to_jsonable(value: Any) -> Any:
    """Dataclasses, pydantic models, enums and paths as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "value") and not isinstance(value, int | float | str | bool):
        return value.value
    return value
