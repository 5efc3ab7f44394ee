"""The nodes section of a process test's job file over net_memif: server s0 (10.0.0.1)
with one memif port per worker, and workers w0, w1, ... (10.0.0.11, ...), each on its own
link."""


def memif_nodes(workers, socket, server_lcores, worker_lcore, shards=1):
    """Lines from "nodes:" on. socket(w): worker w's socket path; server_lcores: the
    server's lcore list as YAML ("[0, 1]"); worker_lcore(w): worker w's lcore."""
    y = ["nodes:",
         "  - name: s0", "    role: server", "    ipv4: 10.0.0.1",
         "    mac: 02:00:00:00:00:01", "    ports:"]
    for w in range(workers):
        y.append("      - net_memif%d,role=server,id=0,socket=%s" % (w, socket(w)))
    y += ["    lcores: %s" % server_lcores, "    shards: %d" % shards]
    for w in range(workers):
        y += ["  - name: w%d" % w, "    role: worker", "    ipv4: 10.0.0.%d" % (11 + w),
              "    mac: 02:00:00:00:00:%02x" % (0x11 + w),
              "    ports: [\"net_memif1%d,role=client,id=0,socket=%s\"]" % (w, socket(w)),
              "    lcores: [%d]" % worker_lcore(w)]
    return y
