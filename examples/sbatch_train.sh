#!/bin/bash
# Two nodes, one mbr-launch per node, two workers per node. Submit from the repository root:
#
#     sbatch examples/sbatch_train.sh [TRAINING ARGS...]      e.g. --steps 200 --fault-step 30
#
# - srun --kill-on-bad-exit=0: when one node's launcher exits with an error, srun leaves the others
#   running, so mbr-launch (not srun) decides whether the job goes on.
# - A worker crash is restarted inside the job (--max-restarts), on every node at once.
# - Preemption (scancel --signal=TERM, or USR1 from `#SBATCH --signal=USR1@60`): the workers get
#   SIGTERM to checkpoint, then node 0 requeues the job (--requeue-on-preemption, needs --requeue);
#   it comes back with SLURM_RESTART_COUNT=1 and resumes from the checkpoint in $CKPT_DIR.
#
#SBATCH --job-name=mbr-train
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Slurm runs a copy of this script from its spool directory: find the repository through the submit dir.
cd "${SLURM_SUBMIT_DIR:?submit this script with sbatch from the repository root}"
if [ -f .venv/bin/activate ]; then
  . .venv/bin/activate
fi
# Every node must see the checkpoints: keep them on the shared filesystem, one directory per job (a
# requeued job keeps its id, so it finds its own checkpoint).
export CKPT_DIR=${CKPT_DIR:-$SLURM_SUBMIT_DIR/checkpoints/job-$SLURM_JOB_ID}
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, restart ${SLURM_RESTART_COUNT:-0}, checkpoints in $CKPT_DIR"

srun --kill-on-bad-exit=0 mbr-launch --nproc-per-node 2 --max-restarts 2 --requeue-on-preemption \
  examples/train_plain.py "$@"
