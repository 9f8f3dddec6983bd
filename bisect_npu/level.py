"""What a session's level is, as a value: `LevelSpec`, a union tagged by `kind`. The journal header
keeps it beside the request; a found culprit's descent (orchestration/bisection.py) returns the finer
level's. A kind is one class here (and in the union) plus one handler there.

- `releases`: published versions of the request's package;
- `commits`: a repository's first-parent commits, each built, or laid over a release's venv
  (`overlay_on_release`);
- `merge`: the commits a merge on the line above brought in (`scope`);
- `dependency`: a declared dependency's commits between two pins, the upstream held (`held`);
- `settings`: the settings at one commit (a culprit, `commit`) between the recipe and a good
  variant (`good_set`): searched by delta debugging (orchestration/settings_search.py), not bisected.

Nothing of the package is imported here: a level is data.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MergeScope(_Spec):
    """A merge level's session: its candidates are the commits the merge `merges[-1]` (the
    session's bad end; its first parent is the good end) brought in, reached through `merges`
    (outermost first). `goods` are the commits known good above it (the run's good end, each outer
    merge's first parent): by git's rule their ancestors are good, so they are no candidates.
    `bad` is the run's own bad end, where the fix search looks from."""

    merges: list[str]
    goods: list[str] = Field(default_factory=list)
    bad: str


class HeldUpstream(_Spec):
    """A dependency-level session's fixed side: the upstream clone and commit every candidate (a
    commit of the dependency) is laid into, and which declared dependency it is."""

    repo: str
    commit: str
    dependency: str
    old_pin: str = ""  # the pins the upstream culprit moved between, as written
    new_pin: str = ""


class _Level(_Spec):
    """What every kind says about its session: what its candidates are called, whether its ends
    are tested first, whether the ends' earlier runs the user counted apply to it."""

    name: ClassVar[str] = "commit"
    takes_earlier_runs: ClassVar[bool] = True  # --earlier-runs counted this level's ends

    def checks_ends(self, asked: bool, noisy: bool) -> bool:
        """Whether the session tests its ends before bisecting, `asked` by --check-ends."""
        return asked


class ReleasesLevel(_Level):
    """Published versions of the request's package, a venv each."""

    kind: Literal["releases"] = "releases"
    name: ClassVar[str] = "release"


class CommitsLevel(_Level):
    """A repository's commits; `overlay_on_release` (`PACKAGE==VERSION`): each laid over that
    release's cached venv instead of built."""

    kind: Literal["commits"] = "commits"
    overlay_on_release: str | None = None


class MergeLevel(CommitsLevel):
    """The commits a merge brought in; its ends were judged in the level above."""

    kind: Literal["merge"] = "merge"  # type: ignore[assignment]
    scope: MergeScope

    def checks_ends(self, asked: bool, noisy: bool) -> bool:
        """Both ends were judged in the level above (the first parent good, the merge bad); noisy
        mode tries them again, since its rates come from the ends' own trials."""
        return asked and noisy


class DependencyLevel(_Level):
    """A dependency's commits between two pins, each laid into the held upstream commit: its ends
    are combinations no level above ran, so they are always tested, and the earlier runs the user
    counted (the upstream's ends) are not theirs."""

    kind: Literal["dependency"] = "dependency"
    held: HeldUpstream
    takes_earlier_runs: ClassVar[bool] = False

    def checks_ends(self, asked: bool, noisy: bool) -> bool:
        return True


class SettingsLevel(_Level):
    """The settings at one commit: the keys the recipe (bad) and its good variant (`good_set`,
    KEY=VALUE as `--settings` gives them) differ in, searched for the smallest set that turns the
    good variant bad. Its candidates are configurations, not commits; it leads nowhere finer."""

    kind: Literal["settings"] = "settings"
    name: ClassVar[str] = "configuration"
    commit: str
    good_set: list[str]
    takes_earlier_runs: ClassVar[bool] = False


LevelSpec = Annotated[ReleasesLevel | CommitsLevel | MergeLevel | DependencyLevel | SettingsLevel,
                      Field(discriminator="kind")]
LEVEL_SPEC: TypeAdapter[LevelSpec] = TypeAdapter(LevelSpec)


def overlay_of(level: LevelSpec) -> str | None:
    """The release a commit level's candidates are laid over, if any."""
    return level.overlay_on_release if isinstance(level, CommitsLevel) else None


def scope_of(level: LevelSpec) -> MergeScope | None:
    return level.scope if isinstance(level, MergeLevel) else None


def held_of(level: LevelSpec) -> HeldUpstream | None:
    return level.held if isinstance(level, DependencyLevel) else None
