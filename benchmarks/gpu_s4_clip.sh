#!/usr/bin/env bash
# Session 4, 4xH200 (x4 kind), call 3: does gradient clipping cost DDP 13 % (410k tok/s with clip vs 470k
# without, at world size 1)? The anchor-shaped loop with each clip (benchmarks/ddp_compile_variants.py,
# CLIP=none|ours|torch|compiled) at 1 and 2 GPUs, then our trainer's DDP at world size 1 profiled.
export PYTHONPATH=$PWD/src TURBOTRAIN_CACHE=$PWD/.data NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT; R=/tmp/runs
for run in 1:none 1:ours 1:torch 1:compiled 2:none 2:ours; do
  IFS=: read -r n c <<< "$run"
  CLIP=$c torchrun --standalone --nproc_per_node=$n benchmarks/ddp_compile_variants.py inplace_outer 2>&1 | grep ms/step \
    | head -1 | sed "s/^/world=$n /" | tee -a $OUT/clip.txt
done
torchrun --standalone --nproc_per_node=1 -m turbotrain profile gpt2-124m parallel.strategy=\"ddp\" run.out_dir="'$R'" \
  run.name=ddp1prof > $OUT/profile_ddp1.log 2>&1 || tail -5 $OUT/profile_ddp1.log
cp $R/ddp1prof/profile/report.json $OUT/profile_ddp1.json; sed -n '1,/^## Recommendations/p' $R/ddp1prof/profile/report.md
