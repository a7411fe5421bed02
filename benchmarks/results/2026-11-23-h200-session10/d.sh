python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl
export PYTHONPATH=src:/tmp/site TURBOTRAIN_CACHE=$PWD/.data
echo "== attention in turbotrain's GPT block"; timeout 120 python .gpu/attn2.py 2>&1 | grep -E "compiled=" | tee $OUT/attn2.txt
C="train.steps=1000 train.eval_every=250 data.eval_batches=8 checkpoint.every=0 model.args.n_layer=4 model.args.n_embd=1536 model.args.n_head=12 model.args.n_kv_head=4 model.args.ffn_hidden=6144 compile.enabled=true run.out_dir='/tmp/cv'"
for seed in 0 1 2; do for p in off tensorwise; do
 echo "== seed $seed fp8 $p"; timeout 150 python -m turbotrain train llama-shakespeare $C precision.fp8=\"$p\" run.seed=$seed run.name=s${seed}_$p 2>&1 | grep -E "fp8:|step 1000/|done" | tee -a $OUT/converge.txt
done; done
