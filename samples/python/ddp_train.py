"""ddp_train.py: PyTorch DistributedDataParallel on CPU (gloo), logged with chorus.

Every rank trains the same small MLP on its own shard of a synthetic
classification task; DDP averages the gradients. All ranks log into one
shared chorus run: loss and accuracy are averaged across ranks by chorus
(define_metric(..., reduce="mean")), each rank's throughput is its own column
(samples_per_s/rank-N), the learning rate is rank 0's ("first"), and every
epoch ends on a chorus barrier. Rank 0 saves the model as an artifact.

    python3 -m torch.distributed.run --nproc_per_node 4 samples/python/ddp_train.py
    chorus launch -n 4 -- python3 samples/python/ddp_train.py
    python3 samples/python/ddp_train.py            # one process
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import chorus


def synthetic(n, seed, features=32, classes=10):
    """A fixed task: labels from a random linear teacher, the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(features, classes, generator=g)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--batch", type=int, default=128, help="mini-batch per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--project", default="chorus-demo")
    args = p.parse_args()

    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)  # the same initial weights on every rank

    model = nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = DDP(model) if distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * args.steps_per_epoch)
    x, y = synthetic(args.batch * args.steps_per_epoch, seed=100 + rank)
    vx, vy = synthetic(2048, seed=10_000 + rank)

    config = {"model": {"hidden": args.hidden, "layers": 2}, "optimizer": {"name": "sgd", "lr": args.lr,
              "momentum": 0.9}, "batch_per_rank": args.batch, "epochs": args.epochs, "torch": torch.__version__}
    with chorus.init(project=args.project, mode="shared", config=config) as run:
        run.define_metric("loss", reduce="mean")
        run.define_metric("accuracy", reduce="mean")
        run.define_metric("val/accuracy", reduce="mean")
        run.define_metric("lr", reduce="first")
        step = 0
        for epoch in range(args.epochs):
            ddp.train()
            for i in range(args.steps_per_epoch):
                t0 = time.perf_counter()
                xb, yb = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
                out = ddp(xb)
                loss = nn.functional.cross_entropy(out, yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                acc = (out.argmax(dim=1) == yb).float().mean()
                # Tensors go in as they are: a CPU tensor is read, a CUDA one
                # would be copied without a host sync.
                run.log({"loss": loss.detach(), "accuracy": acc, "lr": sched.get_last_lr()[0],
                         "samples_per_s": args.batch / (time.perf_counter() - t0)}, step=step)
                step += 1
            ddp.eval()
            with torch.no_grad():
                val_acc = (ddp(vx).argmax(dim=1) == vy).float().mean()
            run.log({"val/accuracy": val_acc, "epoch": epoch}, step=step - 1)
            run.barrier(f"epoch-{epoch}").wait()  # every rank's epoch is committed before the next starts
        if rank == 0:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "model.pt")
                torch.save(model.state_dict(), path)
                run.log_artifact("model.pt", path, type="model").wait()
            run.summary({"final/val_accuracy": float(val_acc)})
        result = run.finish().wait()
        if run.is_host:
            print(f"chorus: the run is in {result.run_dir} ({result.state}, {result.rows} rows)", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
