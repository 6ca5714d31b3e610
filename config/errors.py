"""The one exception type for bad user input.

Anything raised as `UsageError` reaches the user as a single line on stderr and exit code 2 (see
`train_grpo.py`): no traceback, and nothing written to the output directory before the check.
"""


class UsageError(Exception):
    """Bad input from the user: the message names the problem and the fix."""
