"""PyTorch DDP on 127.0.0.1: the external baseline for ragtag's real swarms.

Trains the same MLP as ragtag (ReLU between layers, PyTorch's default
init, which ragtag copies) on a digits-format CSV with ragtag's split: every
fifth row is held out (the first EVAL_SAMPLES of them), the rest is the
training set, which every rank samples whole in its own order, as ragtag's
nodes do (each node draws its own stream over all the training rows).
One process per rank (torch.distributed, gloo, one thread each), AdamW with
gradient clipping, gradients averaged by DistributedDataParallel every
step. Rank r emulates slower hardware as ragtag's `--slowdown` and
`--step-time` do: each step takes max(compute * slowdown_r, step_time_r),
so the all-reduce makes every rank wait for the slowest one.

Rank 0 prints one JSON object per evaluation on stdout:
{"t": seconds since training started, "steps": global steps,
 "samples": samples processed by all ranks, "eval_loss": held-out loss}
and a last {"event": "exit", ...} line. It stops at --duration, or once
the mean of its last three evaluations is at or below --target.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def load_csv(path, eval_samples):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append([float(v) for v in line.split(",")])
    data = torch.tensor(rows, dtype=torch.float32)
    features, labels = data[:, :64] / 16.0, data[:, 64].long()
    index = torch.arange(len(rows))
    held = index[index % 5 == 0][: max(1, eval_samples)]
    train = index[index % 5 != 0]
    return features, labels, held, train


def mlp(hidden):
    widths = [64] + hidden + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    world = len(args.slowdowns)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    features, labels, held, train = load_csv(args.csv, args.eval_samples)
    mine = train
    model = nn.parallel.DistributedDataParallel(mlp(args.hidden))
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), weight_decay=args.weight_decay
    )
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    slowdown, floor = args.slowdowns[rank], args.step_times[rank] if args.step_times else 0.0

    def evaluate():
        with torch.no_grad():
            return loss_fn(model.module(features[held]), labels[held]).item()

    order, pos, steps, last_compute = mine[torch.randperm(len(mine), generator=gen)], 0, 0, 0.0
    start = time.monotonic()
    next_eval, best, reached, recent = 0.0, float("inf"), None, []
    stop = torch.zeros(1)
    while True:
        # The held-out loss, evaluated by rank 0 on the clock (the other
        # ranks wait for it at the next all-reduce; a few ms on this model).
        now = time.monotonic() - start
        if rank == 0 and now >= next_eval:
            loss = evaluate()
            best = min(best, loss)
            print(json.dumps({"t": now, "steps": steps, "samples": steps * args.batch * world, "eval_loss": loss}))
            sys.stdout.flush()
            next_eval = now + args.eval_every
            recent = (recent + [loss])[-3:]
            # The same rule as the benchmark's: the mean of the last three
            # evaluations, so one lucky evaluation does not end the run.
            if reached is None and args.target is not None and len(recent) == 3 and sum(recent) / 3 <= args.target:
                reached = now
            stop[0] = 1.0 if (reached is not None or now >= args.duration) else 0.0
        if steps % 20 == 0:
            dist.broadcast(stop, src=0)
            if stop[0] > 0:
                break
        # Emulated hardware: stretch the step to the rank's pace.
        extra = max(last_compute * (slowdown - 1.0), floor - last_compute)
        if extra > 0:
            time.sleep(extra)
        t0 = time.monotonic()
        if pos + args.batch > len(order):
            order, pos = mine[torch.randperm(len(mine), generator=gen)], 0
        idx = order[pos : pos + args.batch]
        pos += args.batch
        opt.zero_grad()
        loss = loss_fn(model(features[idx]), labels[idx])
        loss.backward()  # DDP averages the gradients here, waiting for every rank
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        last_compute = time.monotonic() - t0
        steps += 1
    if rank == 0:
        now = time.monotonic() - start
        print(json.dumps({"event": "exit", "t": now, "steps": steps, "best_loss": best, "time_to_target_s": reached}))
        sys.stdout.flush()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--csv", required=True)
    p.add_argument("--hidden", default="256,256", help="hidden widths, comma separated")
    p.add_argument("--slowdowns", default="1,1,2,4", help="one per rank")
    p.add_argument("--step-times", default="", help="seconds per step floor, one per rank (optional)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--eval-every", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29531)
    args = p.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",") if h]
    args.slowdowns = [float(s) for s in args.slowdowns.split(",")]
    args.step_times = [float(s) for s in args.step_times.split(",")] if args.step_times else []
    if args.step_times and len(args.step_times) != len(args.slowdowns):
        p.error("--step-times needs one value per rank")
    mp.spawn(worker, args=(args,), nprocs=len(args.slowdowns), join=True)


if __name__ == "__main__":
    main()
