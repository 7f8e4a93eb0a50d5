"""Errors that mean the user asked for something wrong: shown as one clear message, no traceback."""


class UserError(Exception):
    """Bad input or a refused action. `exit_code` 1 for invalid input, 2 for usage, others as documented."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
