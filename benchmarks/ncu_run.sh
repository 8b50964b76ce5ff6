# Nsight Compute over the decode kernels (benchmarks/ncu_kernels.py), on the lent GPU machine:
#   bash benchmarks/ncu_run.sh [CASE ...]   CASE = name:kernel-regex:args, e.g. moe120-256:_gate_up_kernel:moe,120b,256
# For each case NAME.txt (every section of --set full), NAME-source.csv (SASS lines with their stall
# samples: summarise with benchmarks/ncu_stalls.py) and NAME.log, packed into $OUT/ncu.tgz (the
# device returns few files). NCU_FLAGS adds flags, e.g. "--cache-control none" to keep L2 warm.
source benchmarks/gpu_env.sh
CASES=${*:-"moe120-256:_gate_up_kernel|_down_kernel:moe,120b,256 moe20-1:_gate_up_kernel|_down_kernel:moe,20b,1
moe20-32:_gate_up_kernel|_down_kernel:moe,20b,32 qkv-1:_small_m_linear_kernel:linear,qkv,1
o-1:_small_m_linear_kernel:linear,o,1 lmhead-1:_small_m_linear_kernel:linear,lm_head,1"}
dir=$(mktemp -d)
for case in $CASES; do
    IFS=: read -r name kern args <<< "$case"
    # shellcheck disable=SC2086
    ncu --clock-control none --set full --import-source no $NCU_FLAGS -k "regex:$kern" --launch-skip 2 \
        --launch-count 2 -o "$dir/$name" -f python3 benchmarks/ncu_kernels.py ${args//,/ } > "$dir/$name.log" 2>&1
    ncu -i "$dir/$name.ncu-rep" --page details > "$dir/$name.txt" 2>&1
    ncu -i "$dir/$name.ncu-rep" --page source --csv --print-source sass > "$dir/$name-source.csv" 2>&1
    grep -E "^  [a-z_]+|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy" "$dir/$name.txt"
done
tar czf "$OUT/ncu.tgz" -C "$dir" --exclude '*.ncu-rep' .
