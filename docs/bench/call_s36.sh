# Session 36, first device call: the all-seven MLP train graph's anatomy against none's (issue 19, point 9).
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s36.sh     (carry .whl: the cupti-python wheels, for the timelines)
# Why: the session-35 timeline showed 9.2 us with no kernel running after the sample's gather in the all-seven
# replay (1.1 us in none's), and the replay's root kernels 50-100 us ahead of the rest under CUPTI. Either the
# graph holds nodes CUPTI's kernel records do not show (memsets, memcpys, empty nodes) on that path, or the
# launch of a larger graph is what the GPU waits for. --anatomy reads the graph's DOT and times the launch.
# Predictions (before the call): all seven's graph 120-200 nodes, none's 50-90; the host's launch of a replay
# 10-40 us (all seven), under the replay's time, so one replay and 20 back to back within 3 us of each other
# for both graphs (as none's 97.7 against 96.7 at 62026c1); if memset or memcpy nodes follow the gather in all
# seven, they are the 9 us. On an H200 (not yet measured for MLP all seven): the all-seven share 40-48%.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
R=/tmp/r36; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
ALL='agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]'
for g in none all collect; do
  t "anatomy $g"
  case $g in
    none) PYTHONPATH=. timeout $(left 60) python3 tools/profile_step.py --graph train --set replay.capacity=100000 --anatomy $R/anat_none.json ;;
    all) PYTHONPATH=. timeout $(left 60) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --anatomy $R/anat_all.json ;;
    collect) PYTHONPATH=. timeout $(left 60) python3 tools/profile_step.py --graph collect --set replay.capacity=100000 --anatomy $R/anat_collect.json ;;
  esac 2>&1 | tail -30
done
t timelines; python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=.:/tmp/cpt timeout $(left 40) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --timeline $R/tl_all.json 2>&1 | head -4
PYTHONPATH=.:/tmp/cpt timeout $(left 40) python3 tools/profile_step.py --graph train --set replay.capacity=100000 --timeline $R/tl_none.json 2>&1 | head -4
t bench_aux; PYTHONPATH=. timeout $(left 90) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 3 --out $R/aux_all.json > /tmp/aux.log 2>&1; grep -E "aux (none|all)" /tmp/aux.log | tail -8
t end; tar czf $OUT/r36.tgz -C $R . && ls $R
