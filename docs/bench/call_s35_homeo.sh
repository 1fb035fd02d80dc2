# Prepared in session 35 for its last device call, on branch homeo-early (6f110bc): homeostatic's control
# forked from q_stats' branch beside the rule's loss, only its add after the loss.
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s35_homeo.sh      (needs abtrees/62026c1, untracked)
# Predictions (session 35, before the call): the GPU tests of homeostatic's placement and kernels pass (the
# trace test: the control has q_stats' nodes among its ancestors and none of the rule's loss; the add has
# both); the all-seven MLP step 2-6 us under 62026c1's on the same machine (the ablation's homeostatic row,
# 5.1 us at e020b55, bounds what its place on the chain can give), none within 1 us.
set -f
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; PYTHONPATH=. timeout $(left 50) python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py tests/parity/test_homeostatic.py > /tmp/t.log 2>&1
grep -E "^(FAILED|ERROR)|^E |passed|failed" /tmp/t.log | head -12; cp /tmp/t.log $OUT/tests.log
ab() { local tree=$1 tag=$2; [ $(left 20) -lt 20 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 30) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
t ab; ab abtrees/62026c1 old_1; ab . homeo_1; ab abtrees/62026c1 old_2; ab . homeo_2; ab abtrees/62026c1 old_3; ab . homeo_3
t end
