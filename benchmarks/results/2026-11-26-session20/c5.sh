# call 5 (one GPU): inductor's mix-order reduction off vs on (torch 2.11's default) for the other presets:
# llama-1b (RMSNorm) and resnet50-synthetic (BatchNorm; CUDA graphs, device-resident data, no coordinate descent), A/B/A/B
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; from=$2; key=$3; shift 3; echo "== tt $name"; timeout $(left) python -m turbotrain train "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -2; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['$key'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=$from and '$key' in r]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'peak', max(r.get('peak_mem_gib',0) for r in map(json.loads, open('$R/tt_$name.jsonl'))))"; t; }
OFF='compile.inductor."triton.mix_order_reduction"=false'
L="llama-1b train.steps=50 train.log_every=10"
N="resnet50-synthetic train.steps=80 train.log_every=10 compile.enabled=true compile.mode=reduce-overhead data.device_resident=true"
tt resnet_on 30 samples_per_s $N
tt resnet_off 30 samples_per_s $N "$OFF"
tt llama_on 20 tokens_per_s $L
tt llama_off 20 tokens_per_s $L "$OFF"
tt resnet_on2 30 samples_per_s $N
tt resnet_off2 30 samples_per_s $N "$OFF"
[ $(left) -gt 220 ] && tt llama_off2 20 tokens_per_s $L "$OFF"
[ $(left) -gt 110 ] && tt llama_on2 20 tokens_per_s $L
cd $OUT && tar czf r.tgz r && rm -rf r
