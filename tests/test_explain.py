"""Explaining the peak through the whole pipeline, on the shipped models."""
import pytest

from jaxmem.xla import explain
from jaxmem.pipeline import AnalyzeOptions, analyze_file

MODELS = __import__("pathlib").Path(__file__).resolve().parent.parent / "models"


def run(model, **kw):
    kw.setdefault("gpu", "h100")
    return analyze_file(str(MODELS / f"{model}.py"), AnalyzeOptions(**kw))


@pytest.mark.parametrize("model,layout,mesh,args", [
    ("llama", "fsdp", "data=8", (("preset", "tiny"), ("batch_size", 16))),
    ("llama", "fsdp_tp", "data=4,model=2", (("preset", "tiny"), ("batch_size", 16))),
    ("resnet", "dp", "data=2", (("preset", "tiny"),)),
])
def test_curve_peak_is_xlas_peak_and_categories_sum_to_it(model, layout, mesh, args):
    r = run(model, layout=layout, mesh=mesh, model_args=args)
    assert max(r.timeline) == r.xla["peak_memory"]          # exact, deviceless GPU
    assert sum(r.peak_categories.values()) == r.xla["peak_memory"]
    assert sum(m.bytes for m in r.modules) == r.xla["peak_memory"]
    assert r.timeline[r.timeline_peak_index] == r.xla["peak_memory"]


def test_dominant_logits_buffer_is_first_with_its_module():
    # a big vocabulary and few layers: the logits dominate the peak
    r = run("llama", mesh="data=1", layout="dp", top=5,
            model_args=(("preset", "tiny"), ("vocab_size", 65536), ("batch_size", 8), ("seq_len", 128)))
    first = r.top_buffers[0]
    assert "lm_head" in first.module_path, r.top_buffers
    assert 65536 in eval(first.shape) or 65536 * 128 in eval(first.shape)


def test_state_buffers_are_named_by_their_leaf():
    r = run("llama", mesh="data=8", layout="fsdp", top=50, model_args=(("preset", "tiny"), ("batch_size", 16)))
    params = [b for b in r.top_buffers if b.category == "params"]
    assert params and all(b.module_path.startswith(("layers", "embed", "lm_head", "final_norm")) for b in params)
    assert "[params]" in {m.module_path for m in r.modules}


def test_leaf_module_strips_optax_levels():
    assert explain.leaf_module("params:layers/attn/wq/kernel") == "layers/attn/wq"
    assert explain.leaf_module("optimizer_state:0/mu/layers/attn/wq/kernel") == "layers/attn/wq"


def test_remat_audit_fires_when_activations_dominate():
    w = explain.audits({"activations": 80}, "dots_saveable", 100)
    assert w and w[0].kind == "remat_saves_too_much" and w[0].bytes == 80
    assert not explain.audits({"activations": 80}, "none", 100)
    assert "try --remat full" in w[0].message


def test_remat_audit_never_advises_the_remat_already_given():
    (w,) = explain.audits({"activations": 80}, "full", 100)
    assert w.kind == "remat_saves_too_much" and "try --remat full" not in w.message
    assert "outside the checkpointed layers" in w.message and "--remat-at" in w.message
