"""PyTorch Lightning, unmodified for mbr-launch: a tiny MLP on random tensors, 2 CPU ranks, DDP (gloo), a
ModelCheckpoint every few steps with last.ckpt, resumed from last.ckpt when it exists. Under mbr-launch (as under
torchrun) Lightning picks its TorchElasticEnvironment (RANK, GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE set) and
starts no processes of its own.

  --ckpt-dir DIR              where ModelCheckpoint writes (and last.ckpt is resumed from)
  --max-steps N --save-every K
  --kill-rank R --kill-at-step N   rank R SIGKILLs itself after optimizer step N (on attempt --kill-restart C, default 0)
  --stop-rank R --stop-at-step N   rank R SIGSTOPs itself after optimizer step N (a hang; attempt --stop-restart C)
  --ready-file PATH           rank 0 writes it after its first optimizer step

Each rank prints "rank R restart C starts at step S" (S: the step restored from the checkpoint); the last line of
rank 0 is "lightning done: global_step=S resumed=True|False restart=C".
"""
import warnings
from pathlib import Path

import injected  # tests/scripts/injected.py: the fault options and their injection

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

args = injected.parser("--ckpt-dir").parse_args()

RANK, RESTART = injected.RANK, injected.RESTART


class TinyMLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Inject(Callback):
    """The faults (``injected``), after an optimizer step: global_step has counted it."""

    def on_train_start(self, trainer, pl_module):
        injected.started(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        injected.after_step(args, trainer.global_step)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 16), torch.randn(args.samples, 1))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=0)
    ckpt_dir = Path(args.ckpt_dir)
    last = ckpt_dir / "last.ckpt"
    resume = last.exists()
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.save_every, save_last=True,
                                 save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", num_nodes=1, max_steps=args.max_steps,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        callbacks=[checkpoint, Inject()], log_every_n_steps=1000)
    print(f"rank {RANK} restart {RESTART} environment {type(trainer.strategy.cluster_environment).__name__} "
          f"resume {resume}", flush=True)
    trainer.fit(TinyMLP(), loader, ckpt_path=str(last) if resume else None)
    if trainer.global_rank == 0:
        print(f"lightning done: global_step={trainer.global_step} resumed={resume} restart={RESTART}", flush=True)


if __name__ == "__main__":
    main()
