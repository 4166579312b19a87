"""Errors a user can cause. The CLI prints them as one message and exits 2."""


class UserError(Exception):
    """A problem with the user's input: its message names the culprit and the fix."""

    exit_code = 2
