# call V (confirmation, same call, one H200): GPT-2 124M preset as shipped now (fused loss "auto" = on, new row
# kernel, one chunk) vs Accelerate; ResNet-50 with CUDA graphs + coordinate-descent tuning vs Accelerate; llama-1b
# preset bf16 (fused loss now one chunk) for its speed and peak memory
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate; print(torch.__version__, accelerate.__version__)" >> $OUT/device.txt
git log -1 --format=%H >> $OUT/device.txt 2>/dev/null
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 590 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; preset=$2; shift 2; echo "== tt $name"; timeout $(left) python -m turbotrain train $preset $C run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/$2 > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log; t; }
tt gpt gpt2-124m train.steps=100
peer acc_gpt "peer.py --framework accelerate --workload gpt --compile-mode reduce-overhead"
R="train.steps=80 compile.enabled=true compile.mode='reduce-overhead' data.device_resident=true"
peer acc_resnet "peer.py --framework accelerate --workload resnet --compile-mode reduce-overhead"
tt llama llama-1b train.steps=40
tt resnet_cdt resnet50-synthetic $R compile.coordinate_descent_tuning=true
