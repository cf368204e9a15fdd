"""planrt's traffic counters against planc explain's communication table, rank by rank.

A program run with PLANRT_REPORT_COMM=1 prints, per rank, the calls and wire bytes of every
collective kind on every group (a mesh axis, the tied-parameter pairs). explain --json lists, per
pipeline stage and async role, the calls and wire bytes per step of each kind and axis. Over a run
of `steps` steps the two must be equal exactly, on every rank: explain reads the same kernels the
program runs. A rank runs the role of its stage (its pipe coordinate) and, under `sync async`,
the master's role when its coordinate on the sync axis is 0, a worker's otherwise. A dropless MoE
layer's all_to_all_v moves only the rows its routing makes: there explain gives a bound, and the
measured bytes must not exceed it (the calls are equal).
"""
import re

KIND = {"all_reduce": "allreduce", "reduce_scatter": "reduce_scatter", "all_gather": "allgather",
        "all_to_all": "alltoall", "send": "send", "recv": "recv", "all_to_all_v": "alltoallv"}
COMM = re.compile(r"planrt: rank (\d+): comm kind=(\w+) group=(\w+) calls=(\d+) bytes=(\d+)")


def mismatches(d, stderr, steps):
    """d: explain's JSON for the plan; stderr: the run's. Returns (differences, bytes measured)."""
    axes = list(d["mesh"])
    sizes = [d["mesh"][a] for a in axes]
    pipe = d["pipeline"]["axis"]
    sync = d.get("sync", {})
    role_axis = sync.get("axis") if sync.get("mode") == "async" else None
    roles = {(r["stage"], r["role"]): r for r in d["roles"]}
    measured = {}
    for m in COMM.finditer(stderr):
        rank, kind, group, calls, nbytes = int(m.group(1)), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
        measured.setdefault(rank, {})[(kind, group)] = (calls, nbytes)
    bad, total = [], 0
    for rank in range(d["world"]):
        coord, x = {}, rank
        for a, n in reversed(list(zip(axes, sizes))):
            coord[a] = x % n
            x //= n
        stage = coord[pipe] if pipe else 0
        role = "all" if not role_axis else "master" if coord[role_axis] == 0 else "worker"
        want = {}
        for row in roles[(stage, role)]["communication"]:
            key = (KIND[row["collective"]], "pair" if row["axis"] == "tied_pair" else row["axis"])
            calls, nbytes = want.get(key, (0, 0))
            want[key] = (calls + round(row["calls"] * steps), nbytes + round(row["wire_bytes"] * steps))
        got = measured.get(rank, {})
        for key in sorted(set(want) | set(got)):
            (wc, wb), (gc, gb) = want.get(key, (0, 0)), got.get(key, (0, 0))
            if key[0] == "alltoallv" and wc == gc and gb <= wb:
                total += gb
                continue
            if want.get(key, (0, 0)) != got.get(key, (0, 0)):
                bad.append(f"rank {rank} {key[0]} on {key[1]}: measured {got.get(key, (0, 0))} (calls, bytes), "
                           f"explain {want.get(key, (0, 0))}")
            total += got.get(key, (0, 0))[1]
    return bad, total
