"""Acceleration techniques, one module each: precision, compile, activation checkpointing,
memory format, optimizers. Each exposes a plain `apply_*`/`build_*` function."""
