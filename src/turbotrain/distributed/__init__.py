"""Data parallelism over torchrun: the process-group environment, DDP and FSDP2, one file each."""
