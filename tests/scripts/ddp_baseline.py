"""PyTorch DDP on 127.0.0.1: the external baseline for ragtag's real swarms.

Trains the same models as ragtag with ragtag's data splits:
- mlp (ReLU between layers, PyTorch's default init, which ragtag copies)
  and cnn (conv3x3(1->c1) relu maxpool2, conv3x3(c1->c2) relu maxpool2,
  dense relu, dense) on a digits-format CSV: every fifth row is held out
  (the first EVAL_SAMPLES of them), the rest is the training set, which
  every rank samples whole in its own order, as ragtag's nodes do (each
  node draws its own stream over all the training rows);
- transformer (ragtag's pre-norm char transformer: GPT-2 init, tanh GELU,
  causal attention) on a text file: the vocabulary is the sorted set of
  its characters, the first nine tenths train (random windows), held-out
  windows of CONTEXT+1 characters step CONTEXT through the last tenth.
One process per rank (torch.distributed, gloo, one thread each), AdamW with
gradient clipping, gradients averaged by DistributedDataParallel every
step. Rank r emulates slower hardware as ragtag's `--slowdown` and
`--step-time` do: each step takes max(compute * slowdown_r, step_time_r),
so the all-reduce makes every rank wait for the slowest one.

Rank 0 prints one JSON object per evaluation on stdout:
{"t": seconds since training started, "steps": global steps,
 "samples": samples processed by all ranks, "eval_loss": held-out loss}
and a last {"event": "exit", ...} line. It stops at --duration, or once
the mean of its last three evaluations is at or below --target. An
evaluation pauses every rank (they wait for rank 0 at the next
all-reduce), so its time is left out of "t": DDP's clock runs only while
it trains.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F


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


class Cnn(nn.Module):
    def __init__(self, side, c1, c2, hidden, classes):
        super().__init__()
        self.side = side
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc1 = nn.Linear(c2 * (side // 4) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        h = x.view(-1, 1, self.side, self.side)
        h = F.max_pool2d(F.relu(self.conv1(h)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn_qkv, self.attn_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp_fc, self.mlp_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        qkv = self.attn_qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp_out(F.gelu(self.mlp_fc(self.ln2(x)), approximate="tanh"))


class CharTransformer(nn.Module):
    """Logits [batch * t, vocab] from tokens [batch, t], as ragtag's."""

    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
        # GPT-2's init, as ragtag's InitScheme::Gpt2.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln"):
                nn.init.ones_(p)
            else:
                residual = "attn_proj" in name or "mlp_out" in name
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x)).view(b * t, -1)


class TextData:
    """ragtag's split of a text file into training tokens and held-out windows."""

    def __init__(self, path, context, eval_samples):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(vocab)}
        tokens = torch.tensor([index[c] for c in text], dtype=torch.long)
        cut = len(tokens) * 9 // 10
        self.vocab, self.context, self.train = len(vocab), context, tokens[:cut]
        held = tokens[cut:]
        starts = list(range(0, len(held) - context, context))[: max(1, eval_samples)]
        self.held_x = torch.stack([held[s : s + context] for s in starts])
        self.held_y = torch.stack([held[s + 1 : s + context + 1] for s in starts])

    def batch(self, n, gen):
        starts = torch.randint(0, len(self.train) - self.context - 1, (n,), generator=gen)
        x = torch.stack([self.train[s : s + self.context] for s in starts])
        y = torch.stack([self.train[s + 1 : s + self.context + 1] for s in starts]).view(-1)
        return x, y


class CsvData:
    """ragtag's split of a digits-format CSV."""

    def __init__(self, path, eval_samples):
        self.features, self.labels, held, train = load_csv(path, eval_samples)
        self.held_x, self.held_y = self.features[held], self.labels[held]
        self.train, self.order, self.pos = train, None, 0

    def batch(self, n, gen):
        if self.order is None or self.pos + n > len(self.order):
            self.order, self.pos = self.train[torch.randperm(len(self.train), generator=gen)], 0
        idx = self.order[self.pos : self.pos + n]
        self.pos += n
        return self.features[idx], self.labels[idx]


def build(args):
    """The data and the model the arguments name."""
    if args.model == "transformer":
        data = TextData(args.text, args.context, args.eval_samples)
        return data, CharTransformer(data.vocab, args.context, args.width, args.layers, args.heads)
    data = CsvData(args.csv, args.eval_samples)
    if args.model == "cnn":
        return data, Cnn(8, args.channels[0], args.channels[1], args.hidden[0], 10)
    return data, mlp(args.hidden)


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    world = len(args.slowdowns)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    data, net = build(args)
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), weight_decay=args.weight_decay
    )
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    slowdown, floor = args.slowdowns[rank], args.step_times[rank] if args.step_times else 0.0

    def evaluate():
        with torch.no_grad():
            total, n = 0.0, len(data.held_x)
            for i in range(0, n, 256):
                x, y = data.held_x[i : i + 256], data.held_y[i : i + 256]
                total += loss_fn(model.module(x), y.reshape(-1)).item() * len(x)
            return total / n

    steps, last_compute, paused = 0, 0.0, 0.0
    start = time.monotonic()
    next_eval, best, reached, recent = 0.0, float("inf"), None, []
    # [stop, progress]: rank 0's clock decides both, so every rank sets the
    # same rate at the same step.
    control = torch.zeros(2)
    while True:
        # The held-out loss, evaluated by rank 0 on the clock. The other
        # ranks wait for it at the next all-reduce, so DDP's clock ("now")
        # leaves the evaluations out.
        now = time.monotonic() - start - paused
        if rank == 0 and now >= next_eval:
            t0 = time.monotonic()
            loss = evaluate()
            paused += time.monotonic() - t0
            best = min(best, loss)
            print(json.dumps({"t": now, "steps": steps, "samples": steps * args.batch * world, "eval_loss": loss}))
            sys.stdout.flush()
            next_eval = now + args.eval_every
            recent = (recent + [loss])[-3:]
            # The same rule as the benchmark's: the mean of the last three
            # evaluations, so one lucky evaluation does not end the run.
            if reached is None and args.target is not None and len(recent) == 3 and sum(recent) / 3 <= args.target:
                reached = now
            control[0] = 1.0 if (reached is not None or now >= args.duration) else 0.0
        if rank == 0:
            control[1] = min(1.0, now / args.duration)
        if steps % 20 == 0:
            dist.broadcast(control, src=0)
            if control[0] > 0:
                break
            if args.schedule == "cosine":
                # Cosine decay over the time budget, to zero at its end.
                for group in opt.param_groups:
                    group["lr"] = args.lr * 0.5 * (1.0 + math.cos(math.pi * float(control[1])))
        # Emulated hardware: stretch the step to the rank's pace.
        extra = max(last_compute * (slowdown - 1.0), floor - last_compute)
        if extra > 0:
            time.sleep(extra)
        t0 = time.monotonic()
        x, y = data.batch(args.batch, gen)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP averages the gradients here, waiting for every rank
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        last_compute = time.monotonic() - t0
        steps += 1
    if rank == 0:
        now = time.monotonic() - start - paused
        print(json.dumps({"event": "exit", "t": now, "steps": steps, "best_loss": best, "time_to_target_s": reached}))
        sys.stdout.flush()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "transformer"])
    p.add_argument("--csv", help="digits-format CSV (mlp, cnn)")
    p.add_argument("--text", help="text file (transformer)")
    p.add_argument("--hidden", default="256,256", help="mlp: hidden widths; cnn: its dense width")
    p.add_argument("--channels", default="16,32", help="cnn: the two convolutions' channels")
    p.add_argument("--transformer", default="16,32,1,4", help="transformer: context,width,layers,heads")
    p.add_argument("--slowdowns", default="1,1,2,4", help="one per rank")
    p.add_argument("--step-times", default="", help="seconds per step floor, one per rank (optional)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--schedule",
        default="constant",
        choices=["constant", "cosine"],
        help="the rate over the run: constant, or cosine decay over --duration",
    )
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
    args.channels = [int(c) for c in args.channels.split(",") if c]
    args.context, args.width, args.layers, args.heads = (int(v) for v in args.transformer.split(","))
    if (args.model == "transformer") != (args.text is not None) or (args.model != "transformer") != (args.csv is not None):
        p.error("--text goes with --model transformer, --csv with mlp and cnn")
    args.slowdowns = [float(s) for s in args.slowdowns.split(",")]
    args.step_times = [float(s) for s in args.step_times.split(",")] if args.step_times else []
    if args.step_times and len(args.step_times) != len(args.slowdowns):
        p.error("--step-times needs one value per rank")
    mp.spawn(worker, args=(args,), nprocs=len(args.slowdowns), join=True)


if __name__ == "__main__":
    main()
