"""A user module whose own import fails (a dependency that is not installed)."""
import userpkg_dependency_that_is_not_installed  # noqa: F401


def build(dim: int = 8):
    raise AssertionError("never reached")
