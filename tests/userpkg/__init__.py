"""User code for the tests: ONE package that lives outside turbotrain's source tree, imported by turbotrain
only through `pkg.module:name` strings in a config, exactly as a real user's code would be
(`model.name = "userpkg.charlm:build"`, `data.name = "userpkg.data:regression"`, ...).

How it gets imported: as the top-level package `userpkg`, with `tests/` on the path.
  - in-process (pytest): tests/conftest.py puts tests/ on sys.path for the whole session;
  - subprocesses: tests.helpers.userpkg_env() returns os.environ with tests/ prepended to PYTHONPATH.
Never import it as `tests.userpkg` (that would be a second copy of every module).

    charlm.py       a character-level GRU LM on inline pangram text (+ charlm.toml)
    regression.py   noisy linear regression, a loss function, a model that returns its loss (+ regression.toml)
    models.py       model factories and losses, good and bad, for the fault tests (fault.toml: a sub-second run)
    data.py         data factories, good and bad, for the fault tests
    broken.py       a module whose own import fails
    slow.py         a dataset that is slow on rank 1 (the straggler test)
    planted.py      planted workloads for the profiler's verdict tests
"""
