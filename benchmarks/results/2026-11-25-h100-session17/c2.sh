export PYTHONPATH=src; timeout 400 python .gpu/micro.py pool,base,stem+pool 2>&1 | grep -E "^step|Error|error" | head -20
