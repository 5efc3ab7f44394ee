"""Nodes as hosts on one machine, for the PMD tests that run processes over
net_af_packet: a network namespace per node, each with a veth named eth0 into a
Linux bridge in one more namespace. Needs root."""
import subprocess


def sh(*args):
    return subprocess.run(args, capture_output=True, text=True, check=True)


def bridge_namespaces(tag, nodes):
    """Namespace `<tag>-<node>` for each node, its eth0 up on bridge br0 of `<tag>-br`;
    returns {node: namespace, "br": the bridge's}. remove_namespaces() deletes them."""
    ns = {n: "%s-%s" % (tag, n) for n in list(nodes) + ["br"]}
    try:
        add_namespaces(tag, nodes, ns)
    except BaseException:
        remove_namespaces(ns)
        raise
    return ns


def add_namespaces(tag, nodes, ns):
    sh("ip", "netns", "add", ns["br"])
    sh("ip", "-n", ns["br"], "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", ns["br"], "link", "set", "br0", "up")
    for i, n in enumerate(nodes):
        sh("ip", "netns", "add", ns[n])
        sh("ip", "link", "add", "v%d-%s" % (i, tag), "type", "veth", "peer", "name",
           "p%d-%s" % (i, tag))
        sh("ip", "link", "set", "v%d-%s" % (i, tag), "netns", ns[n])
        sh("ip", "-n", ns[n], "link", "set", "v%d-%s" % (i, tag), "name", "eth0")
        sh("ip", "link", "set", "p%d-%s" % (i, tag), "netns", ns["br"])
        sh("ip", "-n", ns["br"], "link", "set", "p%d-%s" % (i, tag), "master", "br0")
        sh("ip", "-n", ns["br"], "link", "set", "p%d-%s" % (i, tag), "up")
        sh("ip", "-n", ns[n], "link", "set", "eth0", "up")
        sh("ip", "-n", ns[n], "link", "set", "lo", "up")


def cut_apart(ns, nodes, a, b):
    """Partitions nodes `a` and `b` (of `nodes`, in bridge_namespaces' order) from each
    other only: both bridge ports become isolated, and the bridge forwards nothing
    between two isolated ports (this kernel has neither tc's flower classifier nor its
    drop action, and no nft in the image); each still reaches every other node."""
    for n in (a, b):
        sh("ip", "-n", ns["br"], "link", "set", "p%d-%s" % (list(nodes).index(n), tag_of(ns)),
           "type", "bridge_slave", "isolated", "on")


def tag_of(ns):
    """The tag bridge_namespaces was given (its namespaces are `<tag>-<node>`)."""
    return ns["br"][:-len("-br")]


def remove_namespaces(ns):
    for n in ns.values():
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def end(procs, ns):
    """Kills what of `procs` still runs, then deletes the namespaces."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    remove_namespaces(ns)
