#!/usr/bin/env bash
# GPU measurement for the core trainer, run on the device machine from the repo root:
#   bash benchmarks/gpu_core.sh [anchors] [gpt] [cnn] [extra]
# Needs the ignored folders .anchors (copy of shared/anchors) and .data (turbotrain cache) carried.
# Everything lands under $OUT (results.jsonl + logs); the last lines print a table.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TURBOTRAIN_CACHE=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-anchors gpt cnn}
python3 -c "import torch,sys; print('torch', torch.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name())" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$OUT/env.txt"

tt() {  # tt LABEL PRESET KEY=VALUE...: one turbotrain run, its summary appended to results.jsonl
  local label=$1; shift
  python3 -m turbotrain train "$@" run.out_dir=/tmp/runs run.name="$label" > "$OUT/$label.log" 2>&1 \
    || { echo "{\"label\": \"$label\", \"error\": \"exit $?\"}" >> "$OUT/results.jsonl"; tail -5 "$OUT/$label.log"; return; }
  python3 - "$label" <<'PY' >> "$OUT/results.jsonl"
import json, sys
s = json.load(open(f"/tmp/runs/{sys.argv[1]}/summary.json"))
keep = ("tokens_per_s", "samples_per_s", "mfu", "peak_mem_gib", "compile_s", "step_ms", "final_loss",
        "val_loss", "val_acc", "data_wait_pct", "dtype", "device_name", "torch", "graph_breaks", "compile_fell_back")
print(json.dumps({"label": sys.argv[1], **{k: s.get(k) for k in keep}}))
PY
  tail -1 "$OUT/results.jsonl"
}

for part in $parts; do case $part in
anchors)
  (cd .anchors && python3 anchor_gpt.py ${ANCHORS:-fp32 bf16 bf16_compile_fused accelerate_bf16_compile fabric_bf16_compile}) 2>&1 \
    | grep '^{' | tee -a "$OUT/anchors.jsonl" ;;
gpt-compile)
  tt tt_preset gpt2-124m
  tt tt_bf16_compile_ro_noclip gpt2-124m precision.dtype=bf16 train.grad_clip=0.0
  tt tt_bf16_compile_default_noclip gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 compile.mode=default ;;
gpt-attn)
  tt tt_preset gpt2-124m
  tt tt_noclip gpt2-124m train.grad_clip=0.0
  tt tt_noclip_flash gpt2-124m train.grad_clip=0.0 kernels.attention=default
  tt tt_bf16_eager gpt2-124m compile.enabled=false ;;
gpt)
  tt tt_fp32_eager gpt2-124m precision.dtype=fp32 compile.enabled=false train.steps=30
  tt tt_bf16_eager gpt2-124m precision.dtype=bf16 compile.enabled=false
  tt tt_bf16_compile gpt2-124m precision.dtype=bf16
  tt tt_bf16_compile_noclip gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 ;;
cnn)
  tt tt_cnn_fashion cnn-fashion
  grep -E '^step (250|500|750|1000)/' "$OUT/tt_cnn_fashion.log"; rm -f "$OUT/tt_cnn_fashion.log" ;;
extra)
  tt tt_bf16_compile_noclip_cdt gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 compile.coordinate_descent_tuning=true
  tt tt_bf16_compile_noclip_ro gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 compile.mode=reduce-overhead
  tt tt_bf16_compile_noclip_blocks gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 compile.scope=blocks
  tt tt_bf16_compile_noclip_maxat gpt2-124m precision.dtype=bf16 train.grad_clip=0.0 compile.mode=max-autotune-no-cudagraphs ;;
esac; done
echo "== results"; cat "$OUT/results.jsonl" 2>/dev/null; cat "$OUT/anchors.jsonl" 2>/dev/null
rm -f "$OUT"/tt_*.log.keep 2>/dev/null; true
