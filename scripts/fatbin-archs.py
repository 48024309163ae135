#!/usr/bin/env python3
"""fatbin-archs.py FILE - list the GPU code a CUDA object or library embeds.

Prints one word per fatbin entry: sm_NN for machine code (SASS, an ELF
cubin), compute_NN for PTX.  Reads the fatbin containers directly (magic
0xBA55ED50: u32 magic, u16 version, u16 header size, u64 size; then entries:
u16 kind (1 PTX, 2 ELF), u16 version, u32 header size, u64 payload size, and
the architecture as a u32 at byte 28 of the entry header), because the
toolkit's cuobjdump is not always installed.  Exit 1 when there is none."""
import struct
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)


def entries(data):
    at = data.find(MAGIC)
    while at >= 0:
        _, _, hsize, size = struct.unpack_from("<IHHQ", data, at)
        off, end = at + hsize, at + hsize + size
        while off + 32 <= end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, off)
            (arch,) = struct.unpack_from("<I", data, off + 28)
            if kind not in (1, 2) or ehsize < 32:
                break
            yield ("compute_%d" if kind == 1 else "sm_%d") % arch
            off += ehsize + psize
        at = data.find(MAGIC, max(end, at + 4))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fatbin-archs.py FILE")
    with open(sys.argv[1], "rb") as f:
        found = sorted(set(entries(f.read())))
    if not found:
        sys.exit("%s: no CUDA fatbin found" % sys.argv[1])
    print(" ".join(found))


if __name__ == "__main__":
    main()
