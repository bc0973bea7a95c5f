"""mha inside models: a BERT encoder with every self-attention replaced, and torch.compile /
torch.export of a model that calls it."""
import pytest
import torch

import mha


class MhaBertAttention(torch.nn.Module):
    """transformers' BertAttention (self-attention, then dense + dropout + LayerNorm of the
    residual) with the attention and its output projection done by mha.MultiheadAttention."""

    def __init__(self, attention, num_heads):
        super().__init__()
        self_attention, output = attention.self, attention.output
        embed_dim = output.dense.weight.shape[0]
        self.attention = mha.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        with torch.no_grad():
            self.attention.in_proj_weight.copy_(torch.cat(
                [self_attention.query.weight, self_attention.key.weight,
                 self_attention.value.weight]))
            self.attention.in_proj_bias.copy_(torch.cat(
                [self_attention.query.bias, self_attention.key.bias, self_attention.value.bias]))
            self.attention.out_proj.load_state_dict(output.dense.state_dict())
        self.num_heads = num_heads
        self.layer_norm = output.LayerNorm

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        attn_mask = None
        if attention_mask is not None:
            # transformers' 4-D mask [B, 1, Sq or 1, Sk]: bool (True = attend) or float (added).
            batch, _, query_len, key_len = attention_mask.shape
            mask = attention_mask.expand(batch, self.num_heads, hidden_states.shape[1], key_len)
            mask = mask.reshape(batch * self.num_heads, hidden_states.shape[1], key_len)
            attn_mask = ~mask if mask.dtype == torch.bool else mask.float()
        output, _ = self.attention(hidden_states, hidden_states, hidden_states,
                                   attn_mask=attn_mask, need_weights=False)
        return self.layer_norm(output + hidden_states), None


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_bert_encoder_with_every_attention_replaced(seed, implementation):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=96, num_hidden_layers=3, num_attention_heads=6,
                                     intermediate_size=192, vocab_size=500,
                                     attn_implementation=implementation)
    model = transformers.BertModel(config).eval()  # random weights; nothing is downloaded
    input_ids = torch.randint(0, 500, (3, 23))
    attention_mask = torch.ones(3, 23, dtype=torch.long)
    attention_mask[1, 17:] = 0  # padding
    attention_mask[2, 5:] = 0
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).last_hidden_state
        for layer in model.encoder.layer:
            layer.attention = MhaBertAttention(layer.attention, config.num_attention_heads)
        actual = model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert all(isinstance(layer.attention, MhaBertAttention) for layer in model.encoder.layer)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


class Block(torch.nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.norm = torch.nn.LayerNorm(32)
        self.feed_forward = torch.nn.Linear(32, 32)

    def forward(self, x, padding):
        attended, _ = self.attention(x, x, x, key_padding_mask=padding, need_weights=False)
        return self.feed_forward(self.norm(x + attended))


def block_and_inputs():
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    theirs = Block(attention).eval()
    ours = Block(mha.MultiheadAttention.from_torch(attention)).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 7, 32)
    padding = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    with torch.enable_grad():  # PyTorch's general path (see test_torch_module.reference)
        expected = theirs(x, padding).detach()
    return ours, x, padding, expected


def test_torch_compile_keeps_the_op(seed):
    ours, x, padding, expected = block_and_inputs()
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    with torch.no_grad():
        compiled = torch.compile(ours, backend=backend, fullgraph=True)
        torch.testing.assert_close(compiled(x, padding), expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(torch.compile(ours)(x, padding), expected, atol=2e-5,
                                   rtol=1e-4)
    calls = [node for graph in graphs for node in graph.graph.nodes
             if node.op == "call_function" and "mha.multihead_attention" in str(node.target)]
    assert len(calls) == 1


def test_torch_export(seed):
    ours, x, padding, expected = block_and_inputs()
    with torch.no_grad():
        exported = torch.export.export(ours, (x, padding))
        assert "mha.multihead_attention" in str(exported.graph)
        torch.testing.assert_close(exported.module()(x, padding), expected, atol=2e-5,
                                   rtol=1e-4)
