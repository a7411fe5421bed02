"""The one exception type for mistakes a user can fix: the CLI prints it as `error: ...` and exits 2."""


class UserError(Exception):
    """A bad config, missing data or an impossible setting; the message is one line naming the fix."""
