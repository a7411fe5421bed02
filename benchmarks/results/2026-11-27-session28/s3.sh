# session 28 call 3 (one GPU): exp28 with cuBLASLt algorithms autotuned (EXP28_NALGO=32), a kernel trace
# kernel times alone, then through the preset, A B A B
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cp COMMIT $R/commit.txt
python -c "import torch; print(torch.__version__, torch.version.cuda)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 580 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|rror|exp28" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -4; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
export EXP28_NALGO=32
echo "== micro"; timeout 150 python ../exp28.py micro 2>&1 | tee $R/micro.log | grep -E "micro|rror|tune" ; t
tt base python -m turbotrain train gpt2-124m train.steps=100
EXP28=mlp tt mlp_ss python ../exp28.py train gpt2-124m train.steps=100
EXP28_DB1=dgelu_bgrad EXP28=mlp tt mlp_bs python ../exp28.py train gpt2-124m train.steps=100
tt base2 python -m turbotrain train gpt2-124m train.steps=100
EXP28=mlp tt mlp_ss2 python ../exp28.py train gpt2-124m train.steps=100
EXP28_DB1=bgradb EXP28_DB2=bgradb EXP28=mlp tt mlp_bb python ../exp28.py train gpt2-124m train.steps=100
TRACE_OUT=/tmp/tr_m.json EXP28=mlp tt trm python ../exp28.py train gpt2-124m train.steps=60 'train.callbacks=["trace_cb:Trace"]'
python ../kern2.py /tmp/tr_m.json 15 > $R/kern_mlp.txt; head -45 $R/kern_mlp.txt
cd $OUT && tar czf r.tgz r && rm -rf r
