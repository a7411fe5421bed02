#!/usr/bin/env bash
# The GPU runs owed to issues #3 (2-GPU targets), #5 (GPU profiles, advice followed) and #6 (full benches),
# one part per call (parts can be chained in one call while it stays under 10 minutes).
#
#   here, once (no device time):     bash benchmarks/gpu_next.sh prepare    # .anchors and .data (both ignored)
#   nvidia-h200 (carry .anchors .data), wall time measured 2026-11-22:
#     fsdp1 profile        253 s   DDP vs FSDP2 profiled at one rank; GPT-2/CNN profiles and advice followed
#     bench-gpt            374 s   every variant on GPT-2 124M, Accelerate/Fabric rows, anchors
#     bench-gpt-compare    240 s   (REPEATS=2) the "all" row against Accelerate/Fabric, anchors
#     bench-resnet         514 s   every variant on ResNet-50, Accelerate/Fabric rows, anchors
#     converge             325 s   --converge on gpt-shakespeare and cnn-fashion
#   nvidia-h200-x2:
#     scale                422 s   DDP/FSDP2 1->2 GPUs, bf16 reduction, per-block units, plain DDP anchors
#   nvidia-h200-x4 (GPUS=1,2,4), session 4:
#     scale-ddp profile-ddp2 scale-fsdp   539 s   (SCALE_STEPS=200) DDP with anchors, DDP profiled at 2 GPUs, FSDP2
#     scale-resnet         ~110 s  ResNet-50 DDP (its 4-GPU run failed on the then 512-sample preset)
#   nvidia-h200-x2, session 5: ddp-gap 524-584 s (two versions, see NOTES); scale-ddp (--repeats 2) + scale-fsdp 414 s
#   nvidia-h200-x2, session 6: fsdp-units 332 s; the acceptance command + anchors 315 s; fsdp-var 339 s; numa 256 s
#   next: nothing owed for issue 3 (its acceptance 4 held in session 6's second call)
#   wiring check on a CPU first:     DRY=1 bash benchmarks/gpu_next.sh PART...
# A one-GPU machine counted half its held time that day, so the one-GPU parts and one 2-GPU call fit in
# one session's 30 device-minutes; run each under `timeout` below the call's limit.
#
# Results land in $OUT/results.tar.gz (the device tool returns at most 8 files), rewritten after every part
# so a call cut short still returns what finished; the tables print as each part ends. DRY=1 shrinks every
# model and step count and runs on the CPU: it checks that every command and file path works, its numbers
# mean nothing.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PYTHONPATH=$ROOT/src PYTHONUNBUFFERED=1 TURBOTRAIN_CACHE=$ROOT/.data
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
FINAL=${OUT:-/tmp/out}; OUT=$(mktemp -d); RUNS=${RUNS:-/tmp/runs}; mkdir -p "$FINAL" "$RUNS"
pack() { tar czf "$FINAL/results.tar.gz" -C "$OUT" . ; }
trap 'pack && echo "results: $FINAL/results.tar.gz"' EXIT
trap 'echo "stopped (signal)"; exit 143' TERM INT  # under `timeout`: the EXIT trap still packs what finished
PY=${PY:-python3}
tt() { $PY -m turbotrain "$@"; }

if [ "${DRY:-0}" = 1 ]; then  # tiny shapes on the CPU: wiring only
  GPT2=(model.args.n_layer=2 model.args.n_head=2 model.args.n_embd=64 model.args.block_size=64
        data.args.seq_len=64 data.args.size=64 data.batch_size=4 compile.mode=default run.device=\"cpu\")
  RESNET=(model.args.base_width=8 "data.args.shape=[3,32,32]" data.batch_size=8 data.args.size=64 run.device=\"cpu\")
  SMALL=(train.steps=6 train.log_every=2 train.eval_every=0)
  CPU=(run.device=\"cpu\"); FASHION=(run.device=\"cpu\" data.batch_size=32); EAGER=precision.dtype=fp32
  BENCH=(--variants baseline,accum); CONV_GPT=("${BENCH[@]}"); CONV_CNN=("${BENCH[@]}")
else
  GPT2=(); RESNET=(); SMALL=(); CPU=(); FASHION=(); EAGER=precision.dtype=bf16
  BENCH=(); CONV_GPT=(--variants baseline,tf32,bf16,fp16,compile,accum,all)
  CONV_CNN=(--variants baseline,tf32,bf16,fp16,channels_last,compile,accum,all)
fi
GPUS=${GPUS:-1,2}
bench_copy() {  # bench_copy NAME: the bench's table, json and chart into $OUT
  cp "$RUNS/$1-bench/bench.json" "$OUT/bench_$1.json"; cp "$RUNS/$1-bench/bench.md" "$OUT/bench_$1.md"
  cp "$RUNS/$1-bench/bench.png" "$OUT/bench_$1.png" 2>/dev/null; cat "$RUNS/$1-bench/bench.md"; echo
}

gap_run() {  # gap_run LABEL GPUS [ENV=VALUE...] -- [SETTING...]: one `turbotrain scale` of GPT-2 (DDP; GAP_STRATEGY=fsdp)
  local label=$1 gpus=$2; shift 2; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env ${envs[@]+"${envs[@]}"} $PY -m turbotrain scale gpt2-124m "${GPT2[@]}" --gpus $gpus --strategies ${GAP_STRATEGY:-ddp} \
    train.steps=${SCALE_STEPS:-200} ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" run.name=gap_$label "$@" \
    > "$OUT/scale_gap_$label.log" 2>&1 || tail -5 "$OUT/scale_gap_$label.log"
  cp "$RUNS/gap_$label-scale/scale.json" "$OUT/scale_gap_$label.json" && { echo "== $label"; cat "$RUNS/gap_$label-scale/scale.md"; }
  pack
}
anchor() {  # anchor N: plain PyTorch DDP + compile at N GPUs (skipped by DRY=1)
  [ "${DRY:-0}" = 1 ] || (cd .anchors && torchrun --standalone --nproc_per_node=$1 anchor_ddp.py ddp) 2>&1 \
    | grep '^{' | tee -a "$OUT/anchor_ddp.jsonl"
}

for part in "$@"; do case $part in
prepare)  # here, before any device call
  mkdir -p .anchors && cp ../shared/anchors/*.py .anchors/
  TURBOTRAIN_CACHE=$ROOT/.data $PY -m turbotrain data fetch shakespeare
  TURBOTRAIN_CACHE=$ROOT/.data $PY -m turbotrain data fetch fashion_mnist
  du -sh .anchors .data ;;
bench-gpt)  # issue 6: every technique on GPT-2 124M, Accelerate and Fabric beside it, anchors in the same call
  $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" | tee -a "$OUT/env.txt"
  tt bench gpt2-124m "${GPT2[@]}" train.steps=${STEPS_GPT:-30} ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" \
     run.name=gpt2 ${BENCH[@]+"${BENCH[@]}"} --compare accelerate,fabric > "$OUT/bench_gpt2.log" 2>&1 || tail -5 "$OUT/bench_gpt2.log"
  bench_copy gpt2
  [ "${DRY:-0}" = 1 ] || (cd .anchors && $PY anchor_gpt.py bf16_compile_fused accelerate_bf16_compile fabric_bf16_compile) \
    2>&1 | grep '^{' | tee -a "$OUT/anchors.jsonl" ;;
bench-gpt-compare)  # issue 6: the "all" row against Accelerate and Fabric (loss inside their compiled module), anchors beside
  tt bench gpt2-124m "${GPT2[@]}" train.steps=${STEPS_GPT:-30} ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" \
     run.name=gpt2cmp --variants ${CMP_VARIANTS:-all} --repeats ${REPEATS:-3} --compare accelerate,fabric \
     > "$OUT/bench_gpt2cmp.log" 2>&1 || tail -5 "$OUT/bench_gpt2cmp.log"
  bench_copy gpt2cmp
  [ "${DRY:-0}" = 1 ] || (cd .anchors && $PY anchor_gpt.py bf16_compile_fused accelerate_bf16_compile fabric_bf16_compile) \
    2>&1 | grep '^{' | tee -a "$OUT/anchors_cmp.jsonl" ;;
bench-resnet)  # issue 6: the same for ResNet-50 (channels_last applies here)
  tt bench resnet50-synthetic "${RESNET[@]}" train.steps=${STEPS_RESNET:-30} ${SMALL[@]+"${SMALL[@]}"} \
     run.out_dir="'$RUNS'" run.name=resnet ${BENCH[@]+"${BENCH[@]}"} --compare accelerate,fabric > "$OUT/bench_resnet.log" 2>&1 \
     || tail -5 "$OUT/bench_resnet.log"
  bench_copy resnet
  [ "${DRY:-0}" = 1 ] || (cd .anchors && $PY anchor_resnet.py bf16_cl_compile fp16_cl) 2>&1 | grep '^{' \
    | tee -a "$OUT/anchors.jsonl" ;;
converge)  # issue 6: does each technique reach the same loss / accuracy at the same step on real data?
  tt bench gpt-shakespeare ${SMALL[@]+"${SMALL[@]}"} ${CPU[@]+"${CPU[@]}"} run.out_dir="'$RUNS'" \
     run.name=shakespeare "${CONV_GPT[@]}" --converge > "$OUT/converge_shakespeare.log" 2>&1 \
     || tail -5 "$OUT/converge_shakespeare.log"
  bench_copy shakespeare
  tt bench cnn-fashion ${SMALL[@]+"${SMALL[@]}"} ${FASHION[@]+"${FASHION[@]}"} \
     run.out_dir="'$RUNS'" run.name=fashion "${CONV_CNN[@]}" --converge \
     > "$OUT/converge_fashion.log" 2>&1 || tail -5 "$OUT/converge_fashion.log"
  bench_copy fashion ;;
profile)  # issue 5: breakdowns, and the first piece of advice for eager bf16 followed and measured
  prof() {  # prof LABEL PRESET KEY=VALUE...
    local label=$1; shift
    tt profile "$@" ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" run.name=$label > "$OUT/profile_$label.log" 2>&1 \
      || { tail -8 "$OUT/profile_$label.log"; return; }
    cp "$RUNS/$label/profile/report.json" "$OUT/profile_$label.json"; cp "$RUNS/$label/profile/report.md" "$OUT/profile_$label.md"
  }
  prof gpt2_eager_bf16 gpt2-124m "${GPT2[@]}" compile.enabled=false $EAGER
  prof gpt2_compiled gpt2-124m "${GPT2[@]}" compile.mode=default
  prof cnn_fashion cnn-fashion ${FASHION[@]+"${FASHION[@]}"}
  advice=$($PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['recommendations'][0]['set'] if r['recommendations'] else '')" \
           "$OUT/profile_gpt2_eager_bf16.json" 2>/dev/null)
  echo "advice followed: ${advice:-<none>}"
  base=(gpt2-124m "${GPT2[@]}" compile.enabled=false $EAGER \
        ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'")
  tt train "${base[@]}" run.name=before > "$OUT/advice_before.log" 2>&1
  tt train "${base[@]}" $advice run.name=after > "$OUT/advice_after.log" 2>&1
  $PY - "$RUNS" "$advice" <<'PY' | tee "$OUT/advice.json"
import json, os, sys
runs, advice = sys.argv[1], sys.argv[2]
if not all(os.path.exists(f"{runs}/{n}/summary.json") for n in ("before", "after")):
    print(json.dumps({"advice": advice, "error": "a run failed: see advice_before.log / advice_after.log"}))
    raise SystemExit
b, a = (json.load(open(f"{runs}/{n}/summary.json")) for n in ("before", "after"))
print(json.dumps({"advice": advice, "before_samples_per_s": b["samples_per_s"], "after_samples_per_s": a["samples_per_s"],
                  "speedup": a["samples_per_s"] / b["samples_per_s"], "device": b["device_name"], "torch": b["torch"]}))
PY
  for f in "$OUT"/profile_*.md; do echo "== $f"; grep -E "Verdict|^\| |^[0-9]\." "$f" | head -14; done ;;
fsdp1)  # issue 3: where FSDP2 loses to DDP on one GPU, where it communicates nothing (compiled and eager)
  for run in ddp_compiled:ddp:true fsdp_compiled:fsdp:true ddp_eager:ddp:false fsdp_eager:fsdp:false; do
    IFS=: read -r label strategy comp <<< "$run"
    $PY -m torch.distributed.run --standalone --nproc_per_node=1 -m turbotrain profile gpt2-124m "${GPT2[@]}" \
      ${SMALL[@]+"${SMALL[@]}"} parallel.strategy=\"$strategy\" compile.enabled=$comp compile.mode=default \
      run.out_dir="'$RUNS'" run.name=$label > "$OUT/fsdp1_$label.log" 2>&1 || tail -8 "$OUT/fsdp1_$label.log"
    cp "$RUNS/$label/profile/report.json" "$OUT/fsdp1_$label.json" 2>/dev/null
    sed -n '1,/^## Recommendations/p' "$RUNS/$label/profile/report.md"
    grep -A8 "^| op" "$RUNS/$label/profile/report.md"
  done ;;
scale)  # issue 3: the acceptance command (preset gpt2-124m: bf16, compile, clip 1.0) for DDP and FSDP2, then at
         # 2 GPUs bf16 gradient reduction and FSDP2 per-block units, then the plain DDP anchors; most needed
         # first (under `timeout`, what finished is packed)
  common=(gpt2-124m "${GPT2[@]}" ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'")
  scale_part() {  # scale_part NAME ARGS...: one `turbotrain scale`, its table printed and packed
    local name=$1; shift
    tt scale "${common[@]}" run.name=$name "$@" > "$OUT/scale_$name.log" 2>&1
    cp "$RUNS/$name-scale/scale.json" "$OUT/scale_$name.json" && { echo "== $name"; cat "$RUNS/$name-scale/scale.md"; }; pack
  }
  scale_part base --gpus $GPUS --strategies ddp,fsdp --repeats ${SCALE_REPEATS:-1}  # 2: ~+200 s
  scale_part bf16red 'parallel.grad_compression="bf16"' --gpus 2 --strategies ddp,fsdp
  scale_part blocks 'parallel.fsdp_units="blocks"' --gpus 2 --strategies fsdp
  if [ "${DRY:-0}" != 1 ]; then
    (cd .anchors && for n in 1 2; do torchrun --standalone --nproc_per_node=$n anchor_ddp.py ddp; done) 2>&1 \
      | grep '^{' | tee "$OUT/anchor_ddp.jsonl"
  fi ;;
scale-ddp|scale-fsdp|scale-resnet)  # issues 3 and 7: one strategy/workload at world sizes $GPUS, longer timed window
  # (SCALE_STEPS steps, 3 warm-up steps excluded) than the preset's 60, which moved 8 % between calls
  case $part in
    scale-ddp)    args=(gpt2-124m "${GPT2[@]}" --strategies ddp); name=ddp ;;
    scale-fsdp)   args=(gpt2-124m "${GPT2[@]}" --strategies fsdp); name=fsdp ;;
    scale-resnet) args=(resnet50-synthetic "${RESNET[@]}" --strategies ddp); name=resnet ;;
  esac
  tt scale "${args[@]}" --gpus $GPUS train.steps=${SCALE_STEPS:-200} ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" \
     run.name=$name ${SCALE_ARGS:-} > "$OUT/scale_$name.log" 2>&1 || tail -5 "$OUT/scale_$name.log"
  cp "$RUNS/$name-scale/scale.json" "$OUT/scale_$name.json" && { echo "== $name"; cat "$RUNS/$name-scale/scale.md"; }
  if [ $part = scale-ddp ] && [ "${DRY:-0}" != 1 ]; then  # plain PyTorch DDP at the same world sizes, same call
    (cd .anchors && for n in ${GPUS//,/ }; do torchrun --standalone --nproc_per_node=$n anchor_ddp.py ddp; done) 2>&1 \
      | grep '^{' | tee -a "$OUT/anchor_ddp.jsonl"
  fi ;;
ddp-gap)  # issue 3, all on one machine, most needed first. Session 5's first call (this part as of commit 0659a13) found
          # clipping costing our DDP 14 % at 1 GPU and 100 MB buckets +17 % at 2 GPUs: here 100 MB buckets at 1 and 2
          # GPUs, the anchor, the 25 MB default again, 100 MB without clipping, clipping without DDP, 250 MB buckets
  gap_run b100 $GPUS -- parallel.bucket_cap_mb=100
  for n in ${GPUS//,/ }; do anchor $n; done; pack
  gap_run shipped $GPUS --
  gap_run b100noclip $GPUS -- parallel.bucket_cap_mb=100 train.grad_clip=0.0
  for clip in 1.0 0.0; do  # one process, no DDP: does clipping cost this much without it?
    tt train gpt2-124m "${GPT2[@]}" train.steps=${SCALE_STEPS:-200} ${SMALL[@]+"${SMALL[@]}"} train.grad_clip=$clip \
      run.out_dir="'$RUNS'" run.name=noddp_clip$clip > "$OUT/train_noddp_clip$clip.log" 2>&1
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('no DDP, clip', sys.argv[2], 'tok/s', round(d['tokens_per_s']))" \
      "$RUNS/noddp_clip$clip/summary.json" $clip | tee -a "$OUT/noddp.txt"
  done; pack
  gap_run b250 $GPUS -- parallel.bucket_cap_mb=250 ;;
fsdp-units)  # issue 3: FSDP2 units of several blocks (overlap at a few units' host cost) against one unit and DDP, 2 GPUs
  gap_run ddp 2 --
  for u in model 2 3 4; do GAP_STRATEGY=fsdp gap_run fsdp_$u 2 -- parallel.fsdp_units=$u; done
  GAP_STRATEGY=fsdp gap_run fsdp_3_keep 2 -- parallel.fsdp_units=3 parallel.reshard_after_forward=false
  GAP_STRATEGY=fsdp gap_run fsdp_3_blockcompile 2 -- parallel.fsdp_units=3 compile.scope=\"blocks\"
  gap_run ddp_again 2 -- ;;  # drift over the call
fsdp-var)  # issue 3: FSDP2 (one unit) at 2 GPUs moved 10 % between runs where DDP moved 0.1 %: 3 runs each with their
           # per-run summaries and step logs (episodic hiccups or a steady slow mode?), then FSDP2 profiled at 2 GPUs
  tt scale gpt2-124m "${GPT2[@]}" --gpus 2 --strategies fsdp,ddp --repeats ${SCALE_REPEATS:-3} \
     train.steps=${SCALE_STEPS:-200} ${SMALL[@]+"${SMALL[@]}"} run.out_dir="'$RUNS'" run.name=var > "$OUT/scale_var.log" 2>&1 \
     || tail -5 "$OUT/scale_var.log"
  cp "$RUNS/var-scale/scale.json" "$OUT/scale_var.json"; cat "$RUNS/var-scale/scale.md"
  (cd "$RUNS" && tar czf "$OUT/var_runs.tar.gz" var-scale-*/summary.json var-scale-*/metrics.jsonl); pack
  $PY -m torch.distributed.run --standalone --nproc_per_node=2 -m turbotrain profile gpt2-124m "${GPT2[@]}" \
    ${SMALL[@]+"${SMALL[@]}"} parallel.strategy=\"fsdp\" run.out_dir="'$RUNS'" run.name=fsdp2prof \
    > "$OUT/profile_fsdp2.log" 2>&1 || tail -8 "$OUT/profile_fsdp2.log"
  cp "$RUNS/fsdp2prof/profile/report.json" "$OUT/profile_fsdp2.json" 2>/dev/null
  sed -n '1,/^## Recommendations/p' "$RUNS/fsdp2prof/profile/report.md" ;;
numa)  # issue 3: FSDP2 at 2 GPUs looked host-jitter bound (fsdp-var: GPU util 78-90 %, steps 35-43 ms, DDP's 36-37 ms at
       # ~100 %): do ranks on exclusive CPU cores (torchrun --numa-binding=exclusive) steady it? Rounds interleaved.
  { lscpu | grep -iE "^CPU\(s\)|NUMA|Model name|Thread"; nvidia-smi topo -m; } > "$OUT/cpu.txt" 2>&1; cat "$OUT/cpu.txt"
  numa_run() {  # numa_run LABEL STRATEGY [TORCHRUN OPTION...]: 2 ranks of GPT-2, tok/s per GPU (whole window, median window)
    local label=$1 strategy=$2; shift 2
    $PY -m torch.distributed.run --standalone --nproc_per_node=2 "$@" -m turbotrain train gpt2-124m "${GPT2[@]}" \
      parallel.strategy=\"$strategy\" train.steps=${SCALE_STEPS:-200} ${SMALL[@]+"${SMALL[@]}"} checkpoint.every=0 \
      run.out_dir="'$RUNS'" run.name=numa_$label > "$OUT/numa_$label.log" 2>&1 || tail -5 "$OUT/numa_$label.log"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); k=d['tokens_per_s']/d['samples_per_s']/2
print(sys.argv[2], 'tok/s per GPU', round(d['samples_per_s']*k), 'median window', round(d['samples_per_s_median_window']*k))" \
      "$RUNS/numa_$label/summary.json" $label | tee -a "$OUT/numa.txt"
    cp "$RUNS/numa_$label/metrics.jsonl" "$OUT/numa_$label.metrics.jsonl" 2>/dev/null; pack
  }
  bind=(--numa-binding=exclusive); [ "${DRY:-0}" = 1 ] && bind=()  # a CPU-only machine has no GPU to bind near
  for r in 1 2 3; do numa_run fsdp_free_$r fsdp; numa_run fsdp_excl_$r fsdp "${bind[@]}"; done
  numa_run ddp_free ddp; numa_run ddp_excl ddp "${bind[@]}" ;;
profile-ddp2)  # issue 3: DDP at 2 GPUs profiled (rank 0's view: exposed communication, compute, host)
  $PY -m torch.distributed.run --standalone --nproc_per_node=2 -m turbotrain profile gpt2-124m "${GPT2[@]}" \
    ${SMALL[@]+"${SMALL[@]}"} parallel.strategy=\"ddp\" ${SCALE_ARGS:-} run.out_dir="'$RUNS'" run.name=ddp2prof \
    > "$OUT/profile_ddp2.log" 2>&1 || tail -8 "$OUT/profile_ddp2.log"
  cp "$RUNS/ddp2prof/profile/report.json" "$OUT/profile_ddp2.json" 2>/dev/null
  sed -n '1,/^## Recommendations/p' "$RUNS/ddp2prof/profile/report.md" ;;
*) echo "unknown part $part (prepare bench-gpt bench-gpt-compare bench-resnet converge profile fsdp1 scale scale-ddp scale-fsdp scale-resnet ddp-gap fsdp-units fsdp-var numa profile-ddp2)"; exit 2 ;;
esac; pack; done
