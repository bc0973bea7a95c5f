"""ONNX Runtime peers: the forward pass as com.microsoft Attention (self-attention; its fused
QKV projection included) or MultiHeadAttention (cross-attention, projections by MatMul) plus the
output projection (MatMul + Add); a decode step as MultiHeadAttention with past key and value
(ORT appends the new token's and returns the present ones), or with grouped heads as
GroupQueryAttention over a cache that past and present share. f32 (the forward pass in f16 too),
CPU execution provider, intra-op threads as given. Graphs are built with the onnx package from
random weights."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from report import median_ms



def _session(graph, threads):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _weights(E, rng):
    bound = 1 / np.sqrt(E)
    return lambda *shape: rng.uniform(-bound, bound, shape).astype(np.float32)


def _output_projection(nodes, inits, context, E, w):
    inits += [numpy_helper.from_array(w(E, E), "wo"), numpy_helper.from_array(w(E), "bo")]
    nodes += [helper.make_node("MatMul", [context, "wo"], ["projected"]),
              helper.make_node("Add", ["projected", "bo"], ["output"])]


# The element types ORT's CPU attention ops take (bf16: none, "Could not find an implementation").
ORT_DTYPES = {"f32": (TensorProto.FLOAT, np.float32), "f16": (TensorProto.FLOAT16, np.float16)}


def measure(dims, threads, min_time_s=0.3, dtype="f32"):
    """Median milliseconds of ORT's forward pass for (B, Sq, Sk, E, H) in `dtype` (a key of
    ORT_DTYPES), no weights returned."""
    B, Sq, Sk, E, H = dims
    rng = np.random.default_rng(0)
    elem, np_type = ORT_DTYPES[dtype]
    w32 = _weights(E, rng)
    w = lambda *shape: w32(*shape).astype(np_type)
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("query", elem, [B, Sq, E])]
    feeds = {"query": rng.uniform(-1, 1, (B, Sq, E)).astype(np_type)}
    if Sq == Sk:
        inits += [numpy_helper.from_array(w(E, 3 * E), "w_qkv"),
                  numpy_helper.from_array(w(3 * E), "b_qkv")]
        nodes.append(helper.make_node("Attention", ["query", "w_qkv", "b_qkv"], ["context"],
                                      domain="com.microsoft", num_heads=H))
    else:
        inputs.append(helper.make_tensor_value_info("key", elem, [B, Sk, E]))
        feeds["key"] = rng.uniform(-1, 1, (B, Sk, E)).astype(np_type)
        for name, source in (("q", "query"), ("k", "key"), ("v", "key")):
            inits.append(numpy_helper.from_array(w(E, E), f"w_{name}"))
            nodes.append(helper.make_node("MatMul", [source, f"w_{name}"], [name]))
        inits.append(numpy_helper.from_array(w(3 * E), "b_qkv"))
        nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v", "b_qkv"], ["context"],
                                      domain="com.microsoft", num_heads=H))
    _output_projection(nodes, inits, "context", E, w)
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("output", elem, [B, Sq, E])], inits)
    session = _session(graph, threads)
    return median_ms(lambda: session.run(None, feeds), min_time_s)


def measure_decode(batch, cached, E, H, threads, min_time_s=0.3):
    """Median milliseconds of one ORT decode step against `cached` past keys and values."""
    d = E // H
    rng = np.random.default_rng(0)
    w = _weights(E, rng)
    f32 = TensorProto.FLOAT
    nodes, inits = [], []
    for name in ("q", "k", "v"):
        inits.append(numpy_helper.from_array(w(E, E), f"w_{name}"))
        nodes.append(helper.make_node("MatMul", ["token", f"w_{name}"], [name]))
    inits.append(numpy_helper.from_array(w(3 * E), "b_qkv"))
    nodes.append(helper.make_node(
        "MultiHeadAttention", ["q", "k", "v", "b_qkv", "", "", "past_key", "past_value"],
        ["context", "present_key", "present_value"], domain="com.microsoft", num_heads=H))
    _output_projection(nodes, inits, "context", E, w)
    past = [batch, H, cached, d]
    graph = helper.make_graph(
        nodes, "decode",
        [helper.make_tensor_value_info("token", f32, [batch, 1, E]),
         helper.make_tensor_value_info("past_key", f32, past),
         helper.make_tensor_value_info("past_value", f32, past)],
        [helper.make_tensor_value_info("output", f32, [batch, 1, E]),
         helper.make_tensor_value_info("present_key", f32, [batch, H, cached + 1, d]),
         helper.make_tensor_value_info("present_value", f32, [batch, H, cached + 1, d])], inits)
    session = _session(graph, threads)
    feeds = {"token": rng.uniform(-1, 1, (batch, 1, E)).astype(np.float32),
             "past_key": rng.uniform(-1, 1, past).astype(np.float32),
             "past_value": rng.uniform(-1, 1, past).astype(np.float32)}
    return median_ms(lambda: session.run(["output"], feeds), min_time_s)


def measure_decode_gqa(batch, cached, E, H, kv_heads, threads, min_time_s=0.3):
    """Median milliseconds of one ORT decode step as com.microsoft GroupQueryAttention, `kv_heads`
    key/value heads, over a preallocated cache of cached + 1 positions that past and present
    share (IO binding: the new token's key and value written in place, as ORT's GQA serves)."""
    d = E // H
    rng = np.random.default_rng(0)
    w = _weights(E, rng)
    f32 = TensorProto.FLOAT
    nodes, inits = [], []
    for name, width in (("q", E), ("k", kv_heads * d), ("v", kv_heads * d)):
        inits += [numpy_helper.from_array(w(E, width), f"w_{name}"),
                  numpy_helper.from_array(w(width), f"b_{name}")]
        nodes += [helper.make_node("MatMul", ["token", f"w_{name}"], [f"{name}_raw"]),
                  helper.make_node("Add", [f"{name}_raw", f"b_{name}"], [name])]
    nodes.append(helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["context", "present_key", "present_value"], domain="com.microsoft", num_heads=H,
        kv_num_heads=kv_heads))
    _output_projection(nodes, inits, "context", E, w)
    cache = [batch, kv_heads, cached + 1, d]
    i32 = TensorProto.INT32
    graph = helper.make_graph(
        nodes, "decode_gqa",
        [helper.make_tensor_value_info("token", f32, [batch, 1, E]),
         helper.make_tensor_value_info("past_key", f32, cache),
         helper.make_tensor_value_info("past_value", f32, cache),
         helper.make_tensor_value_info("seqlens_k", i32, [batch]),
         helper.make_tensor_value_info("total_sequence_length", i32, [])],
        [helper.make_tensor_value_info("output", f32, [batch, 1, E]),
         helper.make_tensor_value_info("present_key", f32, cache),
         helper.make_tensor_value_info("present_value", f32, cache)], inits)
    session = _session(graph, threads)
    key, value = (ort.OrtValue.ortvalue_from_numpy(rng.uniform(-1, 1, cache).astype(np.float32))
                  for _ in range(2))
    binding = session.io_binding()
    binding.bind_cpu_input("token", rng.uniform(-1, 1, (batch, 1, E)).astype(np.float32))
    binding.bind_cpu_input("seqlens_k", np.full(batch, cached, np.int32))
    binding.bind_cpu_input("total_sequence_length", np.array(cached + 1, np.int32))
    for name, buffer in (("key", key), ("value", value)):
        binding.bind_ortvalue_input(f"past_{name}", buffer)
        binding.bind_ortvalue_output(f"present_{name}", buffer)
    binding.bind_output("output")
    return median_ms(lambda: session.run_with_iobinding(binding), min_time_s)


def call_overhead_ms(threads, min_time_s=0.2):
    """A session run of one Identity on one float, for scale."""
    f32 = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", f32, [1])],
                              [helper.make_tensor_value_info("y", f32, [1])])
    session = _session(graph, threads)
    x = {"x": np.zeros(1, np.float32)}
    return median_ms(lambda: session.run(None, x), min_time_s)
