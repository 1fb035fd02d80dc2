# Twenty-eighth session: one call for what nine failed starts left time for (the predictions are
# call_branches_s28.sh's and call_branches_s28b.sh's, written before any run): gpu_check at the merged main (every
# GPU test, the five branches' among them; the report of record), then the merged tree against main before the
# merges (82c5e12, .gpu_base): bench_step, bench_aux --encoder mlp and bench_population at P = 64, one tree after the other.
#   OUT=$OUT bash docs/bench/call_s28c.sh <sha>   (carry .gpu_base)
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 575 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
OUT=$OUT bash docs/bench/gpu_s25.sh G $1
for tree in . .gpu_base; do
  n=new; [ "$tree" = .gpu_base ] && n=base
  t "bench_step $n"; (cd $tree && PYTHONPATH=. timeout $(left 70) python3 tools/bench_step.py --no-epoch --no-encoders --no-net-variants --no-dw-variants --no-torch --out $OUT/step_$n.json > $OUT/step_$n.log 2>&1; grep -E "train step|collect step" $OUT/step_$n.log | head -3)
  t "bench_aux $n"; (cd $tree && PYTHONPATH=. timeout $(left 50) python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux_$n.json > $OUT/aux_$n.log 2>&1; grep -E "aux (none|all|horizons|risk|homeostatic|vaccine) .*train step" $OUT/aux_$n.log)
done
for tree in . .gpu_base; do
  n=new; [ "$tree" = .gpu_base ] && n=base
  t "bench_population $n"; (cd $tree && PYTHONPATH=. timeout $(left 90) python3 tools/bench_population.py --arms joined-onekernel,joined-probe --sizes 64 --no-tf32 --no-torch --out $OUT/pop_$n.json > $OUT/pop_$n.log 2>&1; grep -E "64" $OUT/pop_$n.log | grep -viE "memory|bytes" | head -8)
done
t end
