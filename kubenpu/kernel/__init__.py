"""The kernel side: everything that loads, pins and reads the BPF program of bpf/kubenpu.bpf.c.

- `abi`: what the C program and Python agree on (layouts, map names, gate, lost slots);
- `hooks`: the hooks' kernel functions and the privileges each needs;
- `bpfsys`: bpf(2) and libbpf's ring buffer via ctypes, no BCC;
- `maps`: the probe's maps by fd, the same for every loader;
- `core`: the CO-RE loader (the compiled-once object, system libbpf), the default;
- `bcc`: the BCC loader (compiles on the node, needs kernel headers), the fallback;
- `pinned`: the probe pinned in bpffs, adopted at restart, handed over at upgrade;
- `loader`: `open_kernel()` picks and wires these from `probe.*`; the `Kernel` protocol.
"""
