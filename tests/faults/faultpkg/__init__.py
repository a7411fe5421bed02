"""Tiny user code for the fault tests, imported by turbotrain only through `pkg.module:name` strings
(the tests put tests/faults on PYTHONPATH / sys.path). `base.toml` is a sub-second CPU run over it."""
