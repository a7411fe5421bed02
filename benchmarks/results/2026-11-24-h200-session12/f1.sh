# call F1: FP8 convergence on Shakespeare BPE-4096 (as call C), bf16 vs tensorwise + fp8_head + fp8_fast_accum, seeds 0-2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl || exit
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
git log --oneline -1 >> $OUT/device.txt 2>/dev/null
D="data.name=text data.args.path='.data/shakespeare/shakespeare.txt' data.args.tokens='.data/bpe/tokenizer.json' data.batch_size=8"
C="$D train.steps=1000 train.eval_every=250 data.eval_batches=40 train.lr=6e-4 checkpoint.every=0 checkpoint.final=false model.args.n_layer=4 model.args.n_embd=1536 model.args.n_head=12 model.args.n_kv_head=4 model.args.ffn_hidden=6144 compile.enabled=true run.out_dir='/tmp/cv'"
python -m turbotrain train llama-shakespeare $D train.steps=1 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir="'/tmp/warm'" > /tmp/tokenize.log 2>&1
run() { local n=$1 s=$2; shift 2
  timeout 400 python -m turbotrain train llama-shakespeare $C run.seed=$s run.name=$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$?" >> $OUT/rc.txt; }
start=$(date +%s)
for s in 0 1 2; do
  run s${s}_bf16 $s & run s${s}_fast $s 'precision.fp8="tensorwise"' precision.fp8_head=true precision.fp8_fast_accum=true &
done
wait; echo "all done at $(( $(date +%s) - start )) s" >> $OUT/rc.txt
for f in /tmp/s*.log; do echo "== $(basename $f .log)"; grep -E "fp8:|val_loss|done:|rror" $f; done > $OUT/summary.txt
(cd /tmp && tar czf $OUT/logs.tar.gz s*.log)
