"""Errors a user can act on, each with the exit code the CLI ends with."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class BisectError(Exception):
    """An error a user can act on: the message names the cause and the next step."""

    exit_code = 2


class UsageError(BisectError):
    exit_code = 2


class InfrastructureError(BisectError):
    exit_code = 5


def validation_problem(exc: ValidationError, *, skip: int = 0, root: str = "<root>") -> tuple[str, str]:
    """The first problem of a pydantic validation error, for a one-line message: the field's dotted
    path (its first ``skip`` parts dropped, such as a tagged union's tag; ``root`` when none is
    left) and pydantic's message without the "Value error, " its validators' messages carry."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"][skip:]) or root
    return where, first["msg"].removeprefix("Value error, ")
