#!/usr/bin/env bash
# 2-GPU scaling (kind nvidia-h200-x2), from the repo root on the device machine:
#   bash benchmarks/gpu_scale.sh
# turbotrain scale (DDP and FSDP2, bf16 + compile, no clipping like the anchor) and the plain-PyTorch
# DDP anchor in the same call. NVLink multicast stays off (the machine's environment sets it; kept here).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TURBOTRAIN_CACHE=$PWD/.data
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'x', torch.cuda.get_device_name())" | tee "$OUT/env.txt"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$OUT/env.txt"
common="train.grad_clip=0.0 compile.mode=default run.out_dir=/tmp/runs"
python3 -m turbotrain scale gpt2-124m $common run.name=scale --gpus 1,2 --strategies ddp,fsdp 2>&1 | tail -12
cp /tmp/runs/scale-scale/scale.json "$OUT/scale.json"
python3 -m turbotrain scale gpt2-124m $common parallel.bucket_cap_mb=100 run.name=scaleb100 --gpus 1,2 --strategies ddp 2>&1 | tail -6
cp /tmp/runs/scaleb100-scale/scale.json "$OUT/scale_bucket100.json"
cd .anchors
for n in 1 2; do torchrun --standalone --nproc_per_node=$n anchor_ddp.py ddp 2>&1 | grep '^{' | tee -a "$OUT/anchor_ddp.jsonl"; done
