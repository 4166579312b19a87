"""A decoder written the way Flax's NNX docs stack layers: blocks made by nnx.vmap over split rngs, run by
nnx.scan; no remat, no named scopes, no logical names (issue 37's 336M-parameter case: the default size).

    jaxmem analyze benchmarks/outside/nnx_scan_decoder.py --gpu h100 --mesh fsdp=8 --batch 8
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxmem


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.RMSNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False, dtype=jnp.bfloat16,
                                           rngs=rngs)
        self.norm2 = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, dtype=jnp.bfloat16, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x), mask=nnx.make_causal_mask(x[..., 0]))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class Decoder(nnx.Module):
    def __init__(self, d: int, layers: int, heads: int, vocab: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d, rngs=rngs)

        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs: nnx.Rngs):
            return Block(d, heads, rngs)

        self.blocks = make(rngs)
        self.head = nnx.Linear(d, vocab, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, tokens):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(x, block):
            return block(x)

        return self.head(forward(self.embed(tokens), self.blocks))


def loss(model, batch):
    logits = model(batch["tokens"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()


def workload(batch_size: int = 8, seq_len: int = 2048, d_model: int = 1024, layers: int = 24, heads: int = 16,
             vocab: int = 32768):
    tok = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
    return jaxmem.Workload(model=lambda rngs: Decoder(d_model, layers, heads, vocab, rngs),
                           batch={"tokens": tok, "targets": tok}, loss=loss, optimizer=optax.adamw(1e-3))
