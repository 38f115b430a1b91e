#!/usr/bin/env bash
# N agents of one launcher on this machine (c10d on 127.0.0.1, one rank each): launch -> all ranks started,
# and the CPU each agent had used when its worker started (benchmarks/workers/agent_cpu.py). By hand:
#   bash benchmarks/agent_cpu.sh torchrun 32
#   bash benchmarks/agent_cpu.sh mbr-launch 32 --standby off
# KEEP_READY=FILE keeps the per-rank lines (RANK time agent_cpu main_thread other_threads threads tree_cpu).
set -uo pipefail
tool=$1; n=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
bin=$(dirname "$(command -v python)")
[ "$tool" = torchrun ] && export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
port=$((40000 + RANDOM % 20000)); out=$(mktemp -d)
start=$(date +%s.%N)
for i in $(seq 0 $((n - 1))); do
  "$bin/$tool" --nnodes "$n" --nproc-per-node 1 --max-restarts 0 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "cpu$port" "$@" "$here/workers/agent_cpu.py" "$out/ready" \
    > "$out/agent$i.log" 2>&1 &
  [ "$i" = 0 ] && sleep 0.5  # the store's host first
done
wait
python - "$start" "$tool" "$out/ready" <<'PY'
import statistics as st, sys
start, tool, path = float(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [line.split() for line in open(path)]
print(f"{tool}: {len(rows)} ranks, all started {max(float(r[1]) for r in rows) - start:.1f} s after launch; "
      f"agent CPU when its worker started: mean {st.mean(float(r[2]) for r in rows):.2f} s "
      f"(main thread {st.mean(float(r[3]) for r in rows):.2f} s; with its other processes "
      f"{st.mean(float(r[6]) for r in rows):.2f} s)")
PY
[ -n "${KEEP_READY:-}" ] && cp "$out/ready" "$KEEP_READY"
rm -rf "$out"
