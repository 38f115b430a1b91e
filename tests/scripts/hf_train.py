"""Hugging Face Trainer (with accelerate under it), unmodified for mbr-launch: a tiny model built here (no hub, no
tokenizer, no download), random data, 2 CPU ranks with gloo DDP, a checkpoint every few steps, resumed with
``trainer.train(resume_from_checkpoint=True)`` when one exists. Under mbr-launch (as under torchrun) accelerate
reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT and starts no processes of its own.

  --output-dir DIR            TrainingArguments.output_dir (its checkpoint-N folders are resumed from)
  --max-steps N --save-every K
  --kill-rank R --kill-at-step N   rank R SIGKILLs itself after optimizer step N (on attempt --kill-restart C, default 0)
  --stop-rank R --stop-at-step N   rank R SIGSTOPs itself after optimizer step N (a hang; attempt --stop-restart C)
  --ready-file PATH           rank 0 writes it after its first optimizer step

Each rank prints "rank R restart C starts at step S" (S: the step restored from the checkpoint); the last line of
rank 0 is "hf done: global_step=S resumed=True|False restart=C".
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import dataclasses  # noqa: E402
import warnings  # noqa: E402

import injected  # noqa: E402  (tests/scripts/injected.py: the fault options and their injection)

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

args = injected.parser("--output-dir").parse_args()

RANK, RESTART = injected.RANK, injected.RESTART
hf_logging.set_verbosity_error()


class TinyRegressor(torch.nn.Module):
    """What Trainer needs of a model: forward(**batch) returning {"loss": ...}."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


class RandomData(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Inject(TrainerCallback):
    """The faults (``injected``), after an optimizer step: state.global_step has counted it."""

    def on_train_begin(self, targs, state, control, **kwargs):
        injected.started(state.global_step)

    def on_step_end(self, targs, state, control, **kwargs):
        injected.after_step(args, state.global_step)


def training_arguments() -> TrainingArguments:
    wanted = dict(output_dir=args.output_dir, max_steps=args.max_steps, save_strategy="steps",
                  save_steps=args.save_every, per_device_train_batch_size=args.batch, use_cpu=True, no_cuda=True,
                  report_to=[], ddp_backend="gloo", logging_steps=1000, disable_tqdm=True, save_safetensors=False,
                  dataloader_num_workers=0, learning_rate=0.01, seed=0)
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "use_cpu" in known:
        wanted.pop("no_cuda")  # deprecated spelling (transformers < 4.34 has only no_cuda)
    return TrainingArguments(**{k: v for k, v in wanted.items() if k in known})


def main() -> None:
    targs = training_arguments()
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    resume = last is not None
    trainer = Trainer(model=TinyRegressor(), args=targs, train_dataset=RandomData(args.samples),
                      callbacks=[Inject()])
    print(f"rank {RANK} restart {RESTART} world {targs.world_size} backend {targs.ddp_backend} "
          f"resume {last}", flush=True)
    trainer.train(resume_from_checkpoint=True if resume else None)
    if trainer.is_world_process_zero():
        print(f"hf done: global_step={trainer.state.global_step} resumed={resume} restart={RESTART}", flush=True)


if __name__ == "__main__":
    main()
