"""Reference training-step times in JAX on the CPU, for the same models,
batches and optimiser as ragtag's candle trainer (see tests/src/bench/trainer.rs).

Prints one JSON object: {"model name": milliseconds per step, ...}.
"""
import json
import sys
import time

import jax
import jax.numpy as jnp
import optax


def dense(key, fan_in, fan_out):
    bound = 1.0 / fan_in ** 0.5
    return {
        "w": jax.random.uniform(key, (fan_in, fan_out), minval=-bound, maxval=bound),
        "b": jnp.zeros((fan_out,)),
    }


def mlp_init(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [dense(k, a, b) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def mlp_apply(params, x):
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i + 1 < len(params):
            x = jax.nn.relu(x)
    return x


def conv(key, cin, cout):
    bound = 1.0 / (cin * 9) ** 0.5
    return {"w": jax.random.uniform(key, (cout, cin, 3, 3), minval=-bound, maxval=bound), "b": jnp.zeros((cout,))}


def cnn_init(key, side, c1, c2, hidden, classes):
    k = jax.random.split(key, 4)
    return {
        "c1": conv(k[0], 1, c1),
        "c2": conv(k[1], c1, c2),
        "f1": dense(k[2], c2 * (side // 4) ** 2, hidden),
        "f2": dense(k[3], hidden, classes),
    }


def conv_apply(p, x):
    y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + p["b"][None, :, None, None]


def pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def cnn_apply(p, x):
    h = pool(jax.nn.relu(conv_apply(p["c1"], x)))
    h = pool(jax.nn.relu(conv_apply(p["c2"], h)))
    h = h.reshape(h.shape[0], -1)
    h = jax.nn.relu(h @ p["f1"]["w"] + p["f1"]["b"])
    return h @ p["f2"]["w"] + p["f2"]["b"]


def ln_init(d):
    return {"g": jnp.ones((d,)), "b": jnp.zeros((d,))}


def ln(p, x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * p["g"] + p["b"]


def gpt_init(key, vocab, ctx, width, layers):
    keys = iter(jax.random.split(key, 3 + 4 * layers))
    n = lambda shape, std=0.02: jax.random.normal(next(keys), shape) * std
    blocks = []
    for _ in range(layers):
        blocks.append({
            "ln1": ln_init(width), "ln2": ln_init(width),
            "qkv": {"w": n((width, 3 * width)), "b": jnp.zeros((3 * width,))},
            "proj": {"w": n((width, width), 0.02 / (2 * layers) ** 0.5), "b": jnp.zeros((width,))},
            "fc": {"w": n((width, 4 * width)), "b": jnp.zeros((4 * width,))},
            "out": {"w": n((4 * width, width), 0.02 / (2 * layers) ** 0.5), "b": jnp.zeros((width,))},
        })
    return {"wte": n((vocab, width)), "wpe": n((ctx, width)), "blocks": blocks, "lnf": ln_init(width),
            "head": {"w": n((width, vocab)), "b": jnp.zeros((vocab,))}}


def gpt_apply(p, tokens, heads):
    b, t = tokens.shape
    x = p["wte"][tokens] + p["wpe"][:t]
    width = x.shape[-1]
    hd = width // heads
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    for blk in p["blocks"]:
        h = ln(blk["ln1"], x)
        qkv = (h @ blk["qkv"]["w"] + blk["qkv"]["b"]).reshape(b, t, 3, heads, hd).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(0, 1, 3, 2)) / hd ** 0.5
        att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, width)
        x = x + y @ blk["proj"]["w"] + blk["proj"]["b"]
        h = ln(blk["ln2"], x)
        x = x + jax.nn.gelu(h @ blk["fc"]["w"] + blk["fc"]["b"], approximate=True) @ blk["out"]["w"] + blk["out"]["b"]
    return (ln(p["lnf"], x) @ p["head"]["w"] + p["head"]["b"]).reshape(b * t, -1)


def time_steps(params, apply, x, y, lr, steps):
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1))
    state = opt.init(params)

    def loss_fn(p):
        logits = apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    for _ in range(5):  # compile and warm up
        params, state, loss = step(params, state)
    loss.block_until_ready()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        params, state, loss = step(params, state)
        loss.block_until_ready()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e3


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    key = jax.random.PRNGKey(0)
    out = {}
    x = jax.random.normal(key, (32, 32))
    y = jax.random.randint(key, (32,), 0, 10)
    out["mlp"] = time_steps(mlp_init(key, [32, 64, 64, 10]), mlp_apply, x, y, 3e-3, steps)
    x = jax.random.normal(key, (128, 784))
    y = jax.random.randint(key, (128,), 0, 10)
    out["mlp-large"] = time_steps(mlp_init(key, [784, 1024, 1024, 10]), mlp_apply, x, y, 1e-3, steps)
    x = jax.random.uniform(key, (32, 1, 8, 8))
    y = jax.random.randint(key, (32,), 0, 10)
    out["cnn"] = time_steps(cnn_init(key, 8, 16, 32, 64, 10), cnn_apply, x, y, 3e-3, steps)
    tokens = jax.random.randint(key, (16, 64), 0, 65)
    targets = jax.random.randint(key, (16 * 64,), 0, 65)
    out["transformer"] = time_steps(gpt_init(key, 65, 64, 128, 2), lambda p, t: gpt_apply(p, t, 4), tokens, targets, 1e-3, steps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
