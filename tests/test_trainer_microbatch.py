"""The micro-batched, row-chunked training step equals the one-batch full-logits step:
same loss and same gradients (within 1e-5) on the built-in tiny policy and on a small random
Qwen2 model with an untied head, whatever the micro-batch size; and a `kl_coef > 0` step
runs against a frozen copy of the starting weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from trainer import tiny_policy as tp
from trainer.loss import LossSettings, policy_loss
from trainer.micro_step import StepSettings, accumulate_gradients, completion_token_logprobs
from trainer.samples import Sample
from trainer.train_loop import Trainer

TOL = 1e-5


def full_logprobs_reference(
    model: Any, samples: Sequence[Sample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-pass path the chunked one replaces: full (B, L, V) logits, then the rows
    at completion positions; kept here verbatim as the reference."""
    seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in samples]
    width = max(len(s) for s in seqs)
    t_max = max(len(s.completion_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits.float()  # (B, L, V)
    rows = torch.zeros((b, t_max), dtype=torch.long)
    targets = torch.zeros((b, t_max), dtype=torch.long)
    mask = torch.zeros((b, t_max))
    temps = torch.ones((b, 1, 1))
    for i, s in enumerate(samples):
        n_p, n_c = len(s.prompt_ids), len(s.completion_ids)
        rows[i, :n_c] = torch.arange(n_p - 1, n_p - 1 + n_c)
        targets[i, :n_c] = torch.tensor(s.completion_ids)
        mask[i, :n_c] = 1.0
        temps[i] = s.temperature if s.temperature > 0 else 1.0
    picked = torch.gather(logits, 1, rows[:, :, None].expand(-1, -1, logits.shape[-1]))
    logp = torch.log_softmax(picked / temps, dim=-1)
    return torch.gather(logp, 2, targets[:, :, None]).squeeze(-1), mask


def _tiny(tok: Any) -> Any:
    return tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)


def _qwen() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _samples(model: Any, n: int, vocab: int, seed: int = 0) -> list[Sample]:
    """n samples of mixed prompt/completion lengths and temperatures; sampler log-probs
    near the model's own so the importance weights are neither all 1 nor all truncated."""
    g = torch.Generator().manual_seed(seed)
    out: list[Sample] = []
    for i in range(n):
        n_p = int(torch.randint(2, 9, (1,), generator=g))
        n_c = int(torch.randint(1, 12, (1,), generator=g))
        p = tuple(int(x) for x in torch.randint(1, vocab, (n_p,), generator=g))
        c = tuple(int(x) for x in torch.randint(1, vocab, (n_c,), generator=g))
        temp = (1.0, 0.7, 0.0)[i % 3]
        out.append(Sample(p, c, (0.0,) * n_c, temp, 0, (b"p", 0, i // 2), float(i % 2), 0.0))
    with torch.no_grad():
        lp, _ = full_logprobs_reference(model, out, 0)
    noise = 0.3 * torch.randn(lp.shape, generator=g)
    return [
        Sample(
            s.prompt_ids,
            s.completion_ids,
            tuple((lp[i, : len(s.completion_ids)] + noise[i, : len(s.completion_ids)]).tolist()),
            s.temperature,
            s.version,
            s.group,
            s.reward,
            s.score,
        )
        for i, s in enumerate(out)
    ]


def _reference_grads(
    model: Any, samples: list[Sample], advs: list[float], loss: LossSettings
) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp, mask = full_logprobs_reference(model, samples, 0)
    sampler = torch.zeros(logp.shape)
    for i, s in enumerate(samples):
        sampler[i, : len(s.sampler_logprobs)] = torch.tensor(s.sampler_logprobs)
    value, _ = policy_loss(logp, logp.detach(), sampler, torch.tensor(advs), mask, loss)
    value.backward()
    return float(value.detach()), [p.grad.clone() for p in model.parameters()]


def _chunked_grads(
    model: Any,
    samples: list[Sample],
    advs: list[float],
    loss: LossSettings,
    step: StepSettings,
) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    value, _ = accumulate_gradients(model, samples, advs, 0, loss, step)
    return value, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("which", ["tiny", "qwen"])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_micro_batched_chunked_step_equals_the_full_step(tok, which, aggregation):
    model = _tiny(tok) if which == "tiny" else _qwen()
    vocab = model.config.vocab_size
    samples = _samples(model, 7, vocab)
    advs = [0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.75]
    loss = LossSettings(aggregation=aggregation)
    ref_value, ref_grads = _reference_grads(model, samples, advs, loss)
    for micro in (1, 3, len(samples)):
        step = StepSettings(micro_batch=micro, logit_chunk=5)
        value, grads = _chunked_grads(model, samples, advs, loss, step)
        assert value == pytest.approx(ref_value, abs=TOL)
        for a, b in zip(grads, ref_grads, strict=True):
            assert torch.allclose(a, b, atol=TOL, rtol=0), (micro, float((a - b).abs().max()))


def test_chunked_logprobs_equal_full_logprobs(tok):
    for model in (_tiny(tok), _qwen()):
        samples = _samples(model, 5, model.config.vocab_size, seed=3)
        with torch.no_grad():
            ref, ref_mask = full_logprobs_reference(model, samples, 0)
            lp, mask = completion_token_logprobs(model, samples, 0, chunk=4)
        assert torch.equal(mask, ref_mask)
        assert torch.allclose(lp * mask, ref * ref_mask, atol=TOL, rtol=0)


def test_body_checkpointing_gives_the_same_gradients():
    model = _qwen()
    samples = _samples(model, 4, model.config.vocab_size, seed=5)
    advs = [1.0, -1.0, 0.5, -0.5]
    loss = LossSettings()
    model.train()
    _, plain = _chunked_grads(model, samples, advs, loss, StepSettings(micro_batch=2))
    _, ckpt = _chunked_grads(
        model, samples, advs, loss, StepSettings(micro_batch=2, grad_checkpointing=True)
    )
    assert model.is_gradient_checkpointing
    model.gradient_checkpointing_disable()
    for a, b in zip(plain, ckpt, strict=True):
        assert torch.allclose(a, b, atol=TOL, rtol=0)


def test_kl_step_runs_against_the_starting_weights(tok):
    torch.manual_seed(0)
    model = _tiny(tok)
    samples = _samples(model, 4, len(tok), seed=7)
    trainer = Trainer(
        model,
        tok,
        group_size=2,
        max_staleness=None,
        loss=LossSettings(kl_coef=0.1),
        lr=1e-2,
        groups_per_step=2,
        publish_every=10**6,
        step_settings=StepSettings(micro_batch=3),
    )
    groups = [samples[:2], samples[2:]]
    first = trainer.train_on(groups)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref before the first step
    second = trainer.train_on(groups)
    assert second["kl"] > 0.0 and trainer.steps == 2
    assert trainer.ref_model is not None
    assert all(not p.requires_grad for p in trainer.ref_model.parameters())


def test_step_settings_refuse_nonsense():
    with pytest.raises(ValueError, match="micro_batch"):
        StepSettings(micro_batch=0)
    with pytest.raises(ValueError, match="logit_chunk"):
        StepSettings(logit_chunk=0)


def test_node_config_sets_the_trainer_micro_batch():
    from node.config import load_config
    from node.errors import CommandError

    assert load_config(None, {})["trainer.micro_batch"] == 8
    assert load_config(None, {"trainer.micro_batch": 3})["trainer.micro_batch"] == 3
    with pytest.raises(CommandError, match="trainer.micro_batch"):
        load_config(None, {"trainer.micro_batch": 0})


def test_no_vocabulary_wide_tensor_beyond_one_chunk_is_kept_for_backward():
    """Every tensor autograd keeps for backward, outside the checkpointed chunks: none is
    as wide as the vocabulary over more rows than one chunk (the full path keeps (B, L, V))."""
    model = _qwen()
    vocab, chunk = model.config.vocab_size, 4
    samples = _samples(model, 6, vocab, seed=9)
    kept: list[tuple[int, ...]] = []

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        kept.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        accumulate_gradients(
            model, samples, [1.0, -1.0] * 3, 0, LossSettings(), StepSettings(3, chunk)
        )
    assert kept, "the hook saw the body's saved tensors"
    head_t = (model.config.hidden_size, vocab)  # the LM head's weight, transposed by linear

    def too_wide(s: tuple[int, ...]) -> bool:
        return bool(s) and s[-1] == vocab and s != head_t and torch.Size(s).numel() > chunk * vocab

    assert not [s for s in kept if too_wide(s)]
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        kept.clear()
        full_logprobs_reference(model, samples, 0)
    assert any(too_wide(s) for s in kept)  # the full path keeps (B, L, V) logits
