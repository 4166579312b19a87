"""jaxmem.truth.classic: the analytic rule users apply today, as they apply it -- on remat, FSDP and ViT cases.

The rule is kept as users know it (the accuracy benchmark's strawman-free comparison is
jaxmem.truth.simulator); these tests pin what it counts, including what it leaves out.
"""

from jaxmem.program.workload import load_workload
from jaxmem.truth import classic

S, B, H, A, V = 2048, 1, 4096, 32, 32000


def dims(layers=1, vocab=V):
    return classic.TransformerDims(layers=layers, heads=A, hidden=H, vocab=vocab, seq=S)


def test_korthikanti_formula_with_the_output_layer():
    output = 4 * S * B * H * (1 + V / H)   # final norm, logits and cross entropy: every token, the whole vocabulary
    assert classic.korthikanti_bytes(dims(), B, 1, "bf16", "none") == int(S * B * H * (34 + 5 * A * S / H) + output)
    assert classic.korthikanti_bytes(dims(), B, 8, "bf16", "none") == int(
        S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8)) + output / 8)
    # fp32: the 2-byte activations double, the 1-byte dropout masks do not
    assert classic.korthikanti_bytes(dims(), B, 1, "fp32", "none") == int(
        S * B * H * (66 + 9 * A * S / H) + 2 * output)
    # the vocabulary term is the output layer's: no vocabulary, 4sbh left
    no_vocab = classic.korthikanti_bytes(dims(vocab=0), B, 1, "bf16", "none")
    assert classic.korthikanti_bytes(dims(), B, 1, "bf16", "none") - no_vocab == int(4 * S * B * V)


def test_full_remat_counts_only_the_stored_layer_inputs():
    # 2sbh per layer, nothing for the layer being recomputed (what the simulator adds)
    for policy in ("full", "nothing_saveable"):
        got = classic.korthikanti_bytes(dims(layers=24), B, 1, "bf16", policy)
        assert got == int(24 * 2 * S * B * H + 4 * S * B * H * (1 + V / H))


def test_bf16_counts_the_softmax_at_two_bytes():
    # the rule scales every 16-bit term with the precision: an fp32 softmax in a bf16 run is counted at 2 bytes
    no_out = dims(vocab=0)
    bf16 = classic.korthikanti_bytes(no_out, B, 1, "bf16", "none")
    short = classic.TransformerDims(layers=1, heads=A, hidden=H, vocab=0, seq=S // 2)
    # attention terms are quadratic in s: 5as^2b bytes in bf16 (2 for the softmax, 2 for its dropout, 1 mask)
    assert bf16 - 2 * classic.korthikanti_bytes(short, B, 1, "bf16", "none") == int(5 * A * S * S * B / 2)


def test_classic_estimate_reads_the_model_config(models_dir):
    wl = load_workload(models_dir / "gpt2.py", preset="tiny")
    est = classic.estimate(wl, param_count=1000, mesh="data=8", layout="fsdp", precision="fp32", optimizer=None,
                           remat="none", batch_size=16)
    assert est.state_bytes == 1000 * 16 // 8
    assert "Korthikanti" in est.rule and "L=2" in est.rule and "s=64" in est.rule and "b=2" in est.rule
    mlp = load_workload(models_dir / "mlp.py", preset="tiny")
    est = classic.estimate(mlp, param_count=1000, mesh="data=1", layout="dp", precision="fp32", optimizer="sgd",
                           remat="none")
    # torchsummary's rule: 2 x (3 hidden Dense outputs of 8 x 256 + the head's 8 x 10) x 4 bytes
    assert est.state_bytes == 8000 and est.activation_bytes == 2 * (3 * 8 * 256 + 8 * 10) * 4


def test_fsdp_shards_the_state_and_nothing_else(models_dir):
    wl = load_workload(models_dir / "gpt2.py", preset="tiny")
    kw = dict(param_count=8000, mesh="data=8", precision="bf16", optimizer=None, remat="full", batch_size=16)
    dp, fsdp = classic.estimate(wl, layout="dp", **kw), classic.estimate(wl, layout="fsdp", **kw)
    assert dp.state_bytes == 8 * fsdp.state_bytes == 8000 * 16
    # no term for the gathered weights of a layer or for gradients before their reduce-scatter
    assert dp.activation_bytes == fsdp.activation_bytes


def test_vit_sequence_is_the_patches_plus_the_class_token_and_the_output_counts_every_token(models_dir):
    wl = load_workload(models_dir / "vit.py", preset="tiny")          # 32x32 images, 8x8 patches, 10 classes
    cfg = classic.model_config(wl)
    assert cfg.patch_size == 8   # from the closure of `lambda rngs: ViT(cfg, rngs=rngs)`
    est = classic.estimate(wl, param_count=1000, mesh="data=8", layout="fsdp", precision="bf16", optimizer=None,
                           remat="full", batch_size=16)
    s, b, h, v, L = (32 // 8) ** 2 + 1, 2, cfg.d_model, cfg.n_classes, cfg.n_layers
    assert "s=17" in est.rule and f"v={v}" in est.rule
    # the output term over all 17 tokens, though ViT's head reads the class token only
    assert est.activation_bytes == int(L * 2 * s * b * h + 4 * s * b * h * (1 + v / h))
