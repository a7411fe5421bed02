"""Monitoring: console/JSONL/TensorBoard logging, FLOPs and MFU, throughput, memory, NVML."""
