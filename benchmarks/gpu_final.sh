#!/usr/bin/env bash
# 2xH200 call: FSDP2 with size-based units vs the per-block run of gpu_scale.sh, and profiles of
# gpt2-124m (eager bf16, compiled) and cnn-fashion on GPU 0.   bash benchmarks/gpu_final.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TURBOTRAIN_CACHE=$PWD/.data
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'x', torch.cuda.get_device_name())" | tee "$OUT/env.txt"
python3 -m turbotrain scale gpt2-124m train.grad_clip=0.0 compile.mode=default run.out_dir=/tmp/runs run.name=fsdpm \
  --gpus 1,2 --strategies fsdp 2>&1 | tail -8
cp /tmp/runs/fsdpm-scale/scale.json "$OUT/scale_fsdp_units_auto.json"
prof() {  # prof LABEL PRESET KEY=VALUE...
  local label=$1; shift
  CUDA_VISIBLE_DEVICES=0 python3 -m turbotrain profile "$@" run.out_dir=/tmp/prof run.name=$label > /tmp/$label.log 2>&1 \
    || { tail -20 /tmp/$label.log; return; }
  cp /tmp/prof/$label/profile/report.json "$OUT/profile_$label.json"; cp /tmp/prof/$label/profile/report.md "$OUT/profile_$label.md"
  grep -E "Verdict|^\| |^[0-9]\." /tmp/prof/$label/profile/report.md | head -14
}
prof gpt2_eager_bf16 gpt2-124m compile.enabled=false
prof gpt2_compiled gpt2-124m compile.mode=default
prof cnn_fashion cnn-fashion
CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/integration/test_profile.py -k gpu 2>&1 | tail -3
