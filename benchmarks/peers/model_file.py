"""The tensor sizes of a model file (config/models/*.txt: name, element count, shape per
line, `#` comments), for the peers baselines (gloo_rank.py, tcp_ps.py)."""


def read_model(path, who):
    """Element counts in file order; exits naming `who` when the file lists none."""
    sizes = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                sizes.append(int(line[1]))
    if not sizes:
        raise SystemExit("%s: no tensors in %s" % (who, path))
    return sizes
