#!/usr/bin/env python3
"""kv_rd.py - how far a KV codec of our kind can go: rate against distortion
of scalar quantizers with entropy coding on real f16 KV files, and the gain a
channel-decorrelating transform (a per-layer, per-head KLT fitted on other
chunks) would add.  Bits are the levels' empirical order-0 entropy (what the
coded type's zstd literal stage reaches within ~2%); keys per channel over the
chunk (the better of levels and token-to-token differences, as coded chooses),
values per token over the channels, each group at a step of its deviation / s;
the error is RMS over the elements relative to the elements' RMS.  Also with a
Hadamard rotation of each head first (as rotation-based KV quantizers do).

usage: kv_rd.py DIR [FILES]   (DIR: a store tier of f16 entries, e.g. the
eval's ~/.cache/cacheblend/eval/MODEL/nq20/store/tiers/main; FILES: how many
files, default 12, sorted by name).  Needs numpy."""
import glob
import struct
import sys

import numpy as np


def load(f):
    """The layers' (K, V) as float32 [n, heads x dim] from an f16 KV file (cbkv(5))."""
    b = open(f, "rb").read()
    H, = struct.unpack_from("<I", b, 12)
    L, nh, hd = struct.unpack_from("<III", b, 48)
    typ, n = struct.unpack_from("<II", b, 72)
    S, B = struct.unpack_from("<QQ", b, 96)
    if typ != 1:
        sys.exit(f"kv_rd: {f}: not an f16 KV file (type {typ})")
    w = nh * hd
    return [(np.frombuffer(b, np.float16, n * w, H + l * S).astype(np.float32).reshape(n, w),
             np.frombuffer(b, np.float16, n * w, H + l * S + B).astype(np.float32).reshape(n, w))
            for l in range(L)], nh, hd


def entropy(q):
    _, c = np.unique(q, return_counts=True)
    p = c / c.sum()
    return -(p * np.log2(p)).sum()


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def quant(x, axis, s):
    mu = x.mean(axis=axis, keepdims=True)
    d = x.std(axis=axis, keepdims=True) + 1e-8
    q = np.round((x - mu) / d * s)
    return q, q / s * d + mu


def main():
    files = sorted(glob.glob(sys.argv[1] + "/*.kv"))[:int(sys.argv[2]) if len(sys.argv) > 2 else 12]
    if len(files) < 2:
        sys.exit(f"kv_rd: {sys.argv[1]}: fewer than 2 KV files")
    data = [load(f) for f in files]
    nh, hd = data[0][1], data[0][2]
    R = hadamard(hd)
    res = {}
    for layers, _, _ in data:
        for k, v in layers:
            for name, x, axis in (("K per channel", k, 0), ("V per token", v, 1)):
                rot = (x.reshape(-1, nh, hd) @ R).reshape(x.shape)
                for tag, y in ((name, x), (name + ", rotated", rot)):
                    for s in (0.5, 1.0, 1.5, 2.0, 3.0):
                        q, xr = quant(y, axis, s)
                        bits = min(entropy(q), entropy(np.diff(q, axis=0))) if axis == 0 else entropy(q)
                        r = res.setdefault((tag, s), [0.0, 0.0, 0.0, 0])
                        r[0] += ((xr - y) ** 2).sum()
                        r[1] += (y ** 2).sum()
                        r[2] += bits * q.size
                        r[3] += q.size
    print(f"{len(files)} files, {len(data[0][0])} layers of {nh} KV heads of {hd}")
    print("| quantizer | steps per deviation | bits an element | relative error |\n|---|---|---|---|")
    for (tag, s), (e, p, bits, n) in sorted(res.items()):
        print(f"| {tag} | {s:g} | {bits / n:.2f} | {np.sqrt(e / p):.3f} |")
    # a KLT per layer and head, fitted on the first half of the files, applied to the rest
    half = len(data) // 2
    for kind, name in ((0, "K less each channel's mean"), (1, "V less each token's mean")):
        gains = []
        for l in range(len(data[0][0])):
            for h in range(nh):
                sl = slice(h * hd, (h + 1) * hd)

                def rows(ds):
                    xs = [d[0][l][kind][:, sl] for d in ds]
                    return np.concatenate([x - x.mean(0 if kind == 0 else 1, keepdims=True) for x in xs])

                tr, te = rows(data[:half]), rows(data[half:])
                _, U = np.linalg.eigh(np.cov(tr.T))
                gains.append(0.5 * (np.log2(te.var(0) + 1e-12).mean() - np.log2((te @ U).var(0) + 1e-12).mean()))
        print(f"{name}: a KLT saves {np.mean(gains):.2f} bits an element over per-channel steps "
              f"(layer-heads from {np.min(gains):.2f} to {np.max(gains):.2f})")


if __name__ == "__main__":
    main()
