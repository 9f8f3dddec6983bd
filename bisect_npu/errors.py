"""Errors a user can act on, each with the exit code the CLI ends with."""

from __future__ import annotations


class BisectError(Exception):
    """An error a user can act on: the message names the cause and the next step."""

    exit_code = 2


class UsageError(BisectError):
    exit_code = 2


class InfrastructureError(BisectError):
    exit_code = 5
