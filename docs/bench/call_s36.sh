# NOT RUN: no device machine started for this script in session 36 (sixteen starts failed); the cut call
# docs/bench/call_s36c.sh ran instead (records in docs/bench/gpu-4a64988/). Kept for its predictions.
# Session 36, first device call: the all-seven MLP train graph's anatomy against none's (issue 19, point 9), and
# vaccine's sums forked early (9268f1b) and its apply folded into Adam's launch (HEAD) against the tree before
# them (6252826).
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s36.sh     (carry .whl: the cupti-python wheels, for the timelines;
#   needs abtrees/6252826 and abtrees/9268f1b, untracked: git archive of those commits' cudarl cuda_src tools)
# Why: the session-35 timeline showed 9.2 us with no kernel running after the sample's gather in the all-seven
# replay (1.1 us in none's), and the replay's root kernels 50-100 us ahead of the rest under CUPTI. Either the
# graph holds nodes CUPTI's kernel records do not show (memsets, memcpys, empty nodes) on that path, or the
# launch of a larger graph is what the GPU waits for. --anatomy reads the graph's DOT and times the launch.
# Predictions (before the call): all seven's graph 120-200 nodes, none's 50-90; the host's launch of a replay
# 10-40 us (all seven), under the replay's time, so one replay and 20 back to back within 3 us of each other
# for both graphs (as none's 97.7 against 96.7 at 62026c1); if memset or memcpy nodes follow the gather in all
# seven, they are the 9 us. On an H200 (not yet measured for MLP all seven): the all-seven share 40-48%.
# Vaccine's sums forked from the last layer's dW branch (the tail after the backward: the apply, about 2-3 us,
# where the one launch took 10.2 us in session 35's timeline): the GPU tests of vaccine's placement and parity
# pass; all seven 4-8 us under 6252826's on the same machine, interleaved; none within 1.5 us of it.
# The apply folded into Adam (optim.clip_adam_soft_vaccine; HEAD): its parity tests pass (the bits of the apply
# then clip_adam_soft, grids 1 to the resident limit), memcheck and racecheck clean on them; all seven a further
# 1.5-3 us under 9268f1b's (the apply node, about 2-3 us, gone; Adam's launch reads 12 bytes an element more).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
R=/tmp/r36; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
ALL='agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]'
t tests; PYTHONPATH=. timeout $(left 150) python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py tests/parity/test_vaccine.py tests/parity/test_optim.py tests/unit/test_aux_reg.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | head -12
t sanitizer; for tool in memcheck racecheck; do PYTHONPATH=. timeout $(left 60) compute-sanitizer --tool $tool --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_optim.py -k "clip_adam_soft_vaccine and 257" > $R/san_$tool.log 2>&1; echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $R/san_$tool.log | tr '\n' ' ')"; done
ab() { local tree=$1 tag=$2; [ $(left 20) -lt 20 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 30) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 3 --out $R/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
t ab; ab abtrees/6252826 old_1; ab abtrees/9268f1b early_1; ab . fold_1; ab abtrees/6252826 old_2; ab abtrees/9268f1b early_2; ab . fold_2
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
t end; tar czf $OUT/r36.tgz -C $R . && ls $R
