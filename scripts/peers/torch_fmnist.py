#!/usr/bin/env python3
"""PyTorch on a Peregrine dense dataset (Fashion-MNIST): softmax regression or the MLP
784-128-10, trained with SGD with momentum as PyTorch users do, either as DDP (gloo, one process
per rank, one thread each) or as one process with several threads. Prints one JSON line:
samples/s over the whole run, training seconds to a full-training-set loss (evaluations
excluded, as Peregrine counts them), the last evaluated loss.

    torch_fmnist.py --data fm-train.pgd --model mlp --mode ddp --procs 2 --batch 128 \
        --epochs 4 --target-loss 0.40 --eval-every 117
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgd  # noqa: E402


def build(model, d, k):
    if model == "softmax":
        return nn.Linear(d, k)
    return nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, k))


def full_loss(net, x, y):
    with torch.no_grad():
        return float(sum(F.cross_entropy(net(x[s:s + 8192]), y[s:s + 8192], reduction="sum")
                         for s in range(0, len(y), 8192)) / len(y))


def train(rank, world, a, port, out):
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xs, ys, k = pgd.dense(a.data)
    x, y = torch.from_numpy(np.array(xs)), torch.from_numpy(ys)
    n, d = x.shape
    net = build(a.model, d, k)
    if world > 1:
        net = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    per = a.batch // world
    steps_per_epoch = n // a.batch
    rng = np.random.default_rng(a.seed)
    it, train_s, to_target, loss = 0, 0.0, None, None
    samples = 0
    for _epoch in range(a.epochs):
        # The same permutation on every rank (same seed); rank r takes its part of each batch.
        order = torch.from_numpy(rng.permutation(n))
        for s in range(steps_per_epoch):
            if world > 1 and it == 0:
                dist.barrier()
            t0 = time.perf_counter()
            idx = order[s * a.batch + rank * per:s * a.batch + (rank + 1) * per]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
            train_s += time.perf_counter() - t0
            it += 1
            samples += a.batch
            if a.eval_every and it % a.eval_every == 0 and a.target_loss is not None:
                if world > 1:
                    dist.barrier()
                loss = full_loss(net, x, y)
                if loss <= a.target_loss:
                    to_target = train_s
                    break
        if to_target is not None:
            break
    if world > 1:
        # Rank 0's clock: every step ends in the all-reduce, so the ranks keep together.
        dist.barrier()
    if rank == 0:
        if loss is None:
            loss = full_loss(net, x, y)
        out.put({"samples_per_second": samples / train_s, "train_seconds": train_s,
                 "time_to_target": to_target, "final_loss": loss, "iterations": it})
    if world > 1:
        dist.destroy_process_group()


def blas():
    """The BLAS library this process loaded (Debian's torch links the libblas.so.3 alternative)."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "blas" in line.lower()}
    return ", ".join(sorted(libs)) or "none"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--model", choices=["softmax", "mlp"], required=True)
    p.add_argument("--mode", choices=["ddp", "single"], required=True)
    p.add_argument("--procs", type=int, default=2, help="DDP processes (ddp)")
    p.add_argument("--threads", type=int, default=None, help="threads per process (default: 1 under ddp, 2 single)")
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--target-loss", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=0, help="iterations between evaluations")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    world = a.procs if a.mode == "ddp" else 1
    if a.threads is None:
        a.threads = 1 if a.mode == "ddp" else 2
    if a.batch % world:
        p.error(f"--batch {a.batch} does not split over {world} processes")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if world > 1:
        port = 29500 + os.getpid() % 1000
        mp.spawn(train, args=(world, a, port, out), nprocs=world, join=True)
    else:
        train(0, 1, a, 0, out)
    r = out.get()
    r.update({"peer": f"pytorch {torch.__version__} ({a.mode}, {world} x {a.threads} threads, BLAS {blas()})",
              "flags": f"SGD lr {a.lr} momentum {a.momentum}, batch {a.batch}"})
    print(json.dumps(r))


if __name__ == "__main__":
    main()
