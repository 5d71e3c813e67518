"""ddp_rank0_only.py: data-parallel training tracked by rank 0 alone.

The first of the three ways to track a distributed job: only rank 0 makes a
run and logs (its loss, the learning rate, validation accuracy each epoch);
the other ranks train without one. This is a W&B script that imports chorus:
`import wandb` and `wandb.init(project=..., config=args)` are the only lines
that would differ (mode="auto" makes the run rank 0's alone). PyTorch DDP on
CPU (gloo), or one plain process.

    python3 -m torch.distributed.run --nproc_per_node 4 samples/python/ddp_rank0_only.py
    chorus launch -n 4 -- python3 samples/python/ddp_rank0_only.py
    python3 samples/python/ddp_rank0_only.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import chorus


def synthetic(n, seed, features=16, classes=4):
    """A fixed task: labels from a random linear teacher, the same on every rank."""
    teacher = torch.randn(features, classes, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return x, (x @ teacher).argmax(dim=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="mini-batch per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--project", default="chorus-demo")
    args = p.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # the same initial weights on every rank

    run = None
    if rank == 0:
        run = chorus.init(project=args.project, mode="auto", config=args)
        run.define_metric("train/loss", summary="min")

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = DDP(model) if distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=args.steps_per_epoch, gamma=0.5)
    x, y = synthetic(args.batch * args.steps_per_epoch, seed=100 + rank)
    vx, vy = synthetic(512, seed=10_000)

    for epoch in range(args.epochs):
        for i in range(args.steps_per_epoch):
            xb, yb = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
            loss = nn.functional.cross_entropy(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            lr = sched.get_last_lr()[0]
            sched.step()
            if run is not None:
                if i == args.steps_per_epoch - 1:
                    with torch.no_grad():
                        accuracy = (model(vx).argmax(dim=1) == vy).float().mean().item()
                    run.log({"val/accuracy": accuracy}, commit=False)  # goes with the step's values below
                run.log({"train/loss": loss.item(), "lr": lr, "epoch": epoch,
                         "samples": (epoch * args.steps_per_epoch + i + 1) * args.batch * world})
    if run is not None:
        run.summary["final/train_loss"] = loss.item()
        run.finish()
        print(f"rank {rank} final train/loss {loss.item()!r}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
