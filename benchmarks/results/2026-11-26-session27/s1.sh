# session 27 call 1 (one GPU): two exact rewrites of GPT-2's block through the real preset (exp27.py): packed
# (cuDNN SDPA via cudnn-frontend writing dq/dk/dv into one qkv-shaped buffer), aug (biases as a weight column);
# the preset before and after, A B C D A; kernel traces of the preset and of the best variant
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, cudnn; print(torch.__version__, triton.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 580 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|rror|TRACE|idle by|exp27" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -4; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
echo "== micro"; timeout 120 python ../exp27.py micro 2>&1 | tee $R/micro.log | grep -E "micro|rror" ; t
tt base python -m turbotrain train gpt2-124m train.steps=100
EXP27=packed tt packed python ../exp27.py train gpt2-124m train.steps=100
EXP27=aug tt aug python ../exp27.py train gpt2-124m train.steps=100
EXP27=packed+aug tt both python ../exp27.py train gpt2-124m train.steps=100
tt base2 python -m turbotrain train gpt2-124m train.steps=100
TRACE_OUT=/tmp/tr_base.json tt trbase python -m turbotrain train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
python ../kern2.py /tmp/tr_base.json 15 > $R/kern_base.txt; head -30 $R/kern_base.txt
EXP27=packed+aug TRACE_OUT=/tmp/tr_both.json tt trboth python ../exp27.py train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
python ../kern2.py /tmp/tr_both.json 15 > $R/kern_both.txt; head -30 $R/kern_both.txt
cd $OUT && tar czf r.tgz r && rm -rf r
