# Run in session 31 (H100, 1a17634): chain_alone.py failed (a capture outside cudarl.graph; since rewritten
# over StepGraph, not run), racecheck ran past its 150 s (a smaller -k ran after: 0 hazards), ncu printed the
# chain's launch statistics (docs/perf-notes.md, thirty-first session).
# Session 31's second device call (the first was `call_s30.sh A 01da88f`): why the chain is slower.
#   chain_alone.py (the chain kernel alone against the panel GEMMs, graphed), racecheck on the chain's tests
#   (the first call's 50 s ran out before its summary), then ncu of the chain and panel kernels at 512 rows.
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-300} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t alone; PYTHONPATH=. timeout $(left 60) python3 docs/bench/chain_alone.py 2>&1 | tail -4
t racecheck; PYTHONPATH=. timeout $(left 150) compute-sanitizer --tool racecheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_gemm.py -k "chain and not 4096 and not 512" 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|hazard|passed|failed" | tail -4
t ncu; PYTHONPATH=. timeout $(left 120) ncu -k regex:cudarl_gemm --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats python3 docs/bench/chain_alone.py > $OUT/ncu.txt 2>&1
grep -E "cudarl_gemm|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Cluster|Block Limit|Dynamic Shared|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu.txt | head -60
t end
