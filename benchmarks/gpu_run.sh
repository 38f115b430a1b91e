#!/usr/bin/env bash
# Run the GPU benchmarks on a lent 2-GPU machine (python3 there has CUDA torch; carry .whl with the NVRx and
# py-spy wheels). Writes logs and RESULTS fragments under $OUT (or benchmarks/out/gpu).
#   usage: bash benchmarks/gpu_run.sh [standby|cold|restart|hang|attribution|deep|scale|all] [trials]
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}; TRIALS=${2:-10}
DEST=${OUT:-benchmarks/out/gpu}; mkdir -p "$DEST"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the host's rule
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
mkdir -p /tmp/site/bin
printf '#!/bin/sh\nexec python3 -m mbr_launch "$@"\n' > /tmp/site/bin/mbr-launch && chmod +x /tmp/site/bin/mbr-launch
export PATH=/tmp/site/bin:$PATH PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi -L; python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())'; python3 -c 'import nvidia_resiliency_ext, importlib.metadata as m; print("nvrx", m.version("nvidia-resiliency-ext"))'; uname -a; nproc; date -u; } 2>&1 | tee "$DEST/machine.txt"
run() { echo "== $*"; timeout 560 "$@" 2>&1 | tail -n 60; }
case $WHAT in
  deep|all|quick) timeout 120 python3 -m mbr_launch.doctor.deep --timeout 60 > "$DEST/deep.json" 2> "$DEST/deep.err"; echo "deep rc=$?"; head -c 2500 "$DEST/deep.json" ;;
esac
case $WHAT in
  quick) run python3 benchmarks/bench_restart.py --gpu --trials "$TRIALS" --deadline 40 --mbr-source tree --no-reference \
           --launchers mbr-launch,torchrun,ft_launcher --out "$DEST/RESULTS-gpu.md" ;;
esac
case $WHAT in
  # Warm standbys (--standby cuda) against torchrun and ft_launcher; FIRST/MERGE continue an earlier run.
  standby|all) run python3 benchmarks/bench_standby.py --gpu --phases restart --settle 5 --deadline 40 \
           --launchers "${LAUNCHERS:-mbr-cuda,torchrun,ft_launcher}" --trials "$TRIALS" --first-trial "${FIRST:-0}" \
           ${MERGE:+--merge "$MERGE"} --mbr-source tree --raw "$DEST/standby-raw.json" --section gpu_standby \
           --title "Restart with warm standbys on 2×H200: mbr-launch, torchrun and ft_launcher in one run" \
           --out "$DEST/RESULTS-gpu.md" ;;
esac
case $WHAT in
  cold|all) run python3 benchmarks/bench_cold.py --gpu --trials "$TRIALS" --mbr-source tree --out "$DEST/RESULTS-gpu.md" ;;
esac
case $WHAT in
  restart|all) run python3 benchmarks/bench_restart.py --gpu --trials "$TRIALS" --mbr-source tree --out "$DEST/RESULTS-gpu.md" ;;
esac
case $WHAT in
  # Hang attribution on NCCL with Flight Recorder: SCENARIOS and LAUNCHERS narrow a call to fit 10 minutes.
  attribution|all) run python3 benchmarks/bench_attribution.py --gpu --trials "$TRIALS" --mbr-source tree \
           --scenarios "${SCENARIOS:-sleep,sigstop,busy,dataloader,other_collective,crash_cascade}" \
           --launchers "${LAUNCHERS:-mbr-launch,mbr-launch-zerocode,ft_launcher}" \
           --raw "$DEST/attribution-raw.json" --out "$DEST/RESULTS-gpu.md" ;;
esac
case $WHAT in
  # Many agents on one machine (no torch in the workers): AGENTS (a comma list), launch and one restart round.
  scale) ulimit -n 65536 2>/dev/null; run python3 benchmarks/bench_scale.py --agents "${AGENTS:-64,128}" --trials "$TRIALS" \
           --launchers "${LAUNCHERS:-mbr-launch,torchrun}" --deadline "${DEADLINE:-240}" --mbr-source tree \
           --raw "$DEST/scale-raw.json" --out "$DEST/RESULTS-scale.md" ${KEEP:+--keep}
         # KEEP=1: every agent's events and stderr come back as one archive
         [ -n "${KEEP:-}" ] && (dest=$(cd "$DEST" && pwd); cd /tmp && tar czf "$dest/scale-logs.tgz" \
           mbr-bench-scale-*/*/agent*.stderr mbr-bench-scale-*/*/logs*/*/events.jsonl); ls -la "$DEST" ;;
esac
case $WHAT in
  hang|all) [ -f benchmarks/bench_hang.py ] && run python3 benchmarks/bench_hang.py --gpu --trials "$TRIALS" --mbr-source tree --out "$DEST/RESULTS-gpu.md" ;;
esac
exit 0
