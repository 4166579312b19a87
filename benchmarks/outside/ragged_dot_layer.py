"""One expert layer written with jax.lax.ragged_dot, as the gemma library's Gemma 4 MoE is (MoERagged):
the smallest step that shows how this XLA compiles ragged_dot for a GPU (benchmarks/outside_libraries.py).

`--arg train_experts=0` freezes the expert weights (stop_gradient; a bias trains instead): the forward alone.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

import jaxmem


class Experts(nn.Module):
    experts: int
    width: int
    expert_width: int
    train_experts: bool = True

    @nn.compact
    def __call__(self, x, group_sizes):
        w = self.param("w", nn.initializers.normal(), (self.experts, self.width, self.expert_width), jnp.bfloat16)
        if not self.train_experts:
            w = jax.lax.stop_gradient(w)
        y = jax.lax.ragged_dot(x, w, group_sizes=group_sizes)
        return y + self.param("b", nn.initializers.zeros, (self.expert_width,), jnp.bfloat16)


def loss(model, batch):
    return jnp.mean(model(batch["x"], batch["group_sizes"]).astype(jnp.float32) ** 2)


def workload(tokens: int = 4096, experts: int = 64, width: int = 256, expert_width: int = 512, train_experts: int = 1):
    return jaxmem.Workload(model=Experts(experts, width, expert_width, bool(train_experts)),
                           batch={"x": jax.ShapeDtypeStruct((tokens, width), jnp.bfloat16),
                                  "group_sizes": jax.ShapeDtypeStruct((experts,), jnp.int32)},
                           loss=loss)
