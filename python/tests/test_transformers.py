"""Hugging Face transformers models with attn_implementation="mha" against the same models with
transformers' own "sdpa" (or "eager", for Gemma 2, whose soft-capping sdpa refuses): tiny
random-weight configs, no hub access. Logits agree to 1e-4, greedy generate() gives the same
tokens, with and without left padding."""
import pytest
import torch
import transformers

import mha.transformers  # noqa: F401  (registers "mha")

VOCAB = 101


def tiny(kind):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaConfig(num_key_value_heads=2, **common), "sdpa"
    if kind == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=2, **common), "sdpa"
    if kind == "mistral":
        return transformers.MistralConfig(num_key_value_heads=1, sliding_window=7, **common), "sdpa"
    if kind == "gemma2":
        return transformers.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=6,
                                         attn_logit_softcapping=2.0, final_logit_softcapping=None,
                                         query_pre_attn_scalar=16, **common), "eager"
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                       n_positions=128), "sdpa"
    raise ValueError(kind)


def pair(config, reference):
    torch.manual_seed(0)
    theirs = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=reference)
    ours = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="mha")
    ours.load_state_dict(theirs.state_dict())
    return theirs.eval(), ours.eval()


def relative_error(got, want):
    return ((got - want).norm() / want.norm()).item()


CAUSAL_LMS = ["llama", "qwen2", "mistral", "gemma2", "gpt2"]


@pytest.mark.parametrize("kind", CAUSAL_LMS)
def test_logits_match(kind):
    theirs, ours = pair(*tiny(kind))
    tokens = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    padding = torch.ones_like(tokens)
    padding[1, :5] = 0  # the second row left-padded
    with torch.no_grad():
        for mask in (None, padding):
            want = theirs(tokens, attention_mask=mask).logits
            got = ours(tokens, attention_mask=mask).logits
            keep = slice(None) if mask is None else mask.bool()
            assert relative_error(got[keep], want[keep]) < 1e-4


@pytest.mark.parametrize("kind", CAUSAL_LMS)
def test_greedy_generate_gives_the_same_tokens(kind):
    theirs, ours = pair(*tiny(kind))
    prompts = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    padding = torch.ones_like(prompts)
    padding[0, :3] = 0
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        for mask in (None, padding):
            want = theirs.generate(prompts, attention_mask=mask, **settings)
            got = ours.generate(prompts, attention_mask=mask, **settings)
            assert torch.equal(got, want)


def test_bert_encoder_with_padding_matches():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=96)
    torch.manual_seed(0)
    theirs = transformers.AutoModel.from_config(config, attn_implementation="sdpa").eval()
    ours = transformers.AutoModel.from_config(config, attn_implementation="mha").eval()
    ours.load_state_dict(theirs.state_dict())
    tokens = torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(tokens)
    padding[0, 11:] = 0
    padding[2, 5:] = 0
    with torch.no_grad():
        want = theirs(tokens, attention_mask=padding).last_hidden_state
        got = ours(tokens, attention_mask=padding).last_hidden_state
    keep = padding.bool()
    assert relative_error(got[keep], want[keep]) < 1e-4


def test_causal_orders_and_windows_reach_the_kernels_without_a_mask(monkeypatch):
    """Without padding the layers pass no mask: the kernels take the causal order and the
    sliding window themselves and skip the key tiles outside them. With padding, the mask."""
    import mha._sdpa
    calls = []
    run = mha._sdpa._run

    def spy(query, key, value, attn_mask, is_causal, scale, left, right, softcap, *rest,
            **options):
        calls.append((attn_mask is not None, left, right, softcap))
        return run(query, key, value, attn_mask, is_causal, scale, left, right, softcap, *rest,
                   **options)

    monkeypatch.setattr(mha._sdpa, "_run", spy)
    _, ours = pair(*tiny("gemma2"))
    tokens = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours(tokens)
    assert sorted(set(calls)) == [(False, -1, 0, 2.0), (False, 5, 0, 2.0)]  # global, sliding
    calls.clear()
    padding = torch.ones_like(tokens)
    padding[0, :4] = 0
    with torch.no_grad():
        ours(tokens, attention_mask=padding)
    assert sorted(set(calls)) == [(True, -1, -1, 2.0)]
