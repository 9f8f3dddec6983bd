"""Errors a user can act on, each with the exit code the CLI ends with."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails


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
    left) and its message (`problem_of`)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"][skip:]) or root
    return where, problem_of(first)


def problem_of(error: ErrorDetails) -> str:
    """One pydantic error's message without the "Value error, " its validators' messages carry, so
    a validator's sentence reads as written."""
    return error["msg"].removeprefix("Value error, ")
