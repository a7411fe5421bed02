"""A tiny user package that lives OUTSIDE turbotrain's source tree.

It is imported by turbotrain only through `pkg.module:factory` strings in a config, exactly as a real
user's code would be: `model.name = "userpkg.charlm:build"`, `data.name = "userpkg.regression:dataset"`,
`train.loss = "userpkg.regression:huber"`. The integration tests put `tests/integration` on PYTHONPATH.
"""
