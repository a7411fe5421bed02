#!/usr/bin/env bash
# Session 4, 4xH200 (x4 kind), call 2: why our DDP at world size 1 runs 15 % under the plain-PyTorch anchor.
# Three ways of compiling DDP (benchmarks/ddp_compile_variants.py) at 1 and 2 GPUs, then our trainer without
# DDP in compile mode default and with DDP without clipping. Results: $OUT/variants.txt
export PYTHONPATH=$PWD/src TURBOTRAIN_CACHE=$PWD/.data NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT; R=/tmp/runs
for n in 1 2; do for w in inplace_outer torch_compile_outer inplace_inner; do
  [ $n = 2 ] && [ $w = torch_compile_outer ] && continue
  torchrun --standalone --nproc_per_node=$n benchmarks/ddp_compile_variants.py $w 2>&1 | grep ms/step | sed "s/^/world=$n /" | tee -a $OUT/variants.txt
done; done
python3 -m turbotrain train gpt2-124m compile.mode=\"default\" train.steps=200 run.out_dir="'$R'" run.name=none_default checkpoint.every=0 > $OUT/none_default.log 2>&1
torchrun --standalone --nproc_per_node=1 -m turbotrain train gpt2-124m parallel.strategy=\"ddp\" train.grad_clip=0.0 train.steps=200 run.out_dir="'$R'" run.name=ddp1_noclip checkpoint.every=0 > $OUT/ddp1_noclip.log 2>&1
for n in none_default ddp1_noclip; do python3 -c "import json,sys; s=json.load(open('$R/$n/summary.json')); print('$n', round(s['tokens_per_s']), s['peak_mem_gib'], s.get('graph_breaks'))" | tee -a $OUT/variants.txt; done
