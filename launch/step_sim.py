"""The simulation behind launch/step_model.py (docs/scaling.md): the trainer's gradient layout
and buckets, NCCL-like collective costs per link, and the replay of one step as a compute and a
communication stream that slow each other down while both are busy. It only reads CSVs and has no
command line: step_model.py calibrates, validates and predicts with it.
"""
import csv
import math
import sys

ALIGN = 64  # ParamLayout::kAlignElems
PRESETS = {  # model/config.cpp: d_model, d_ff, layers, heads
    "tiny": (128, 512, 2, 4), "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32),
}
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
MIB = 1048576.0


def die(msg):
    print(f"step_model.py: {msg}", file=sys.stderr)
    sys.exit(2)


def align_up(x, a):
    return (x + a - 1) // a * a


# ---------------------------------------------------------------------------------------------
# The model's layout and the trainer's units (mirrors model/layout.cpp and comm/grad_sync.cpp)

class Model:
    def __init__(self, d_model, d_ff, layers, vocab=10000, ctx=512, name="custom"):
        self.d, self.f, self.layers, self.vocab, self.ctx, self.name = (
            int(d_model), int(d_ff), int(layers), int(vocab), int(ctx), name)
        # Tensors in buffer order = the order backward finalises them: (name, numel, layer).
        d, f, v = self.d, self.f, self.vocab
        t = [("lm_head.weight", v * d, -1), ("ln_final.weight", d, -1)]
        for i in reversed(range(self.layers)):
            p = f"layers.{i}."
            t += [(p + "ffn.w2.weight", d * f, i), (p + "ffn.w3.weight", f * d, i),
                  (p + "ffn.w1.weight", f * d, i), (p + "ln2.weight", d, i),
                  (p + "attn.output_proj.weight", d * d, i), (p + "attn.v_proj.weight", d * d, i),
                  (p + "attn.k_proj.weight", d * d, i), (p + "attn.q_proj.weight", d * d, i),
                  (p + "ln1.weight", d, i)]
        t.append(("token_embeddings.weight", v * d, -1))
        self.tensors, self.ranges, at = t, [], 0
        for _, n, _ in t:
            self.ranges.append((at, at + n))
            at = align_up(at + n, ALIGN)
        self.total = at
        self.params = sum(n for _, n, _ in t)

    @staticmethod
    def preset(name, vocab=10000, ctx=512):
        if name not in PRESETS:
            die(f"unknown model preset '{name}' (known: {', '.join(PRESETS)})")
        d, f, l, _ = PRESETS[name]
        return Model(d, f, l, vocab, ctx, name)

    def flat(self, world):
        return align_up(self.total, world * ALIGN)

    def backward_flops(self):
        """Per token, for each tensor in buffer order: the backward work done before its gradient
        is final and after the previous one's (matmul FLOPs; attention's core with v_proj)."""
        d, f, v, ctx = self.d, self.f, self.vocab, self.ctx
        out = []
        for name, _, _ in self.tensors:
            s = name.rsplit(".", 2)[-2] if name.startswith("layers.") else name
            if name == "lm_head.weight":
                out.append(4.0 * v * d)
            elif s in ("w1", "w2", "w3"):
                out.append(4.0 * d * f)
            elif s == "output_proj" or s in ("k_proj", "q_proj"):
                out.append(4.0 * d * d)
            elif s == "v_proj":
                out.append(4.0 * d * d + 4.0 * d * ctx)
            else:
                out.append(0.0)  # gains and the embedding's scatter: elementwise
        return out

    def forward_tasks(self):
        """(label, first element, end element, FLOPs per token) in the order forward reads them."""
        d, f, v, ctx = self.d, self.f, self.vocab, self.ctx
        emb = self.ranges[-1]
        tasks = [("embedding", emb[0], emb[1], 0.0)]
        for i in range(self.layers):
            idx = [k for k, (_, _, l) in enumerate(self.tensors) if l == i]
            tasks.append((f"block {i}", self.ranges[idx[0]][0], self.ranges[idx[-1]][1],
                          2.0 * (4 * d * d + 3 * d * f) + 2.0 * d * ctx))
        tasks.append(("head", self.ranges[0][0], self.ranges[1][1], 2.0 * v * d))
        return tasks


def plan_units(model, strategy, bucket_mb, world):
    """[(begin, end, grad_bytes, last_tensor)] as plan_units() in comm/grad_sync.cpp."""
    r, n, flat = model.ranges, len(model.ranges), model.flat(world)

    def unit(first, last):
        b = 0 if first == 0 else r[first][0]
        e = r[last + 1][0] if last + 1 < n else flat
        return (b, e, sum(4 * (r[i][1] - r[i][0]) for i in range(first, last + 1)), last)

    if strategy == "none" or world == 1:
        return []
    if strategy == "flat" or (strategy == "bucketed" and bucket_mb <= 0):
        return [unit(0, n - 1)]
    if strategy in ("naive", "overlap"):
        return [unit(i, i) for i in range(n)]
    if strategy != "bucketed":
        die(f"unknown strategy '{strategy}'")
    cap, units, first, acc = bucket_mb * MIB, [], 0, 0.0
    for i in range(n):
        b = 4.0 * (r[i][1] - r[i][0])
        if i > first and acc + b > cap:
            units.append(unit(first, i - 1))
            first, acc = i, 0.0
        acc += b
    units.append(unit(first, n - 1))
    return units


def update_parts(shard_elems, bucket_mb, pipelined):
    """Part sizes of the ZeRO-1 update (plan_update_parts in comm/grad_sync.cpp)."""
    part = shard_elems
    if pipelined and bucket_mb > 0:
        want = max(int(bucket_mb * MIB / 4), -(-shard_elems // 16))
        part = max(ALIGN, align_up(want, ALIGN))
    return [min(part, shard_elems - a) for a in range(0, shard_elems, part)] or [0]


def describe_units(units):  # the trainer's "gradient sync" log line, to check the mirror
    if not units:
        return "no collectives"
    mib = [u[2] / MIB for u in units]
    head = " ".join(f"{m:.2f}" for m in mib[:12]) + (" ..." if len(mib) > 12 else "")
    return (f"{len(units)} units, {sum(mib):.2f} MiB in all (smallest {min(mib):.2f}, largest "
            f"{max(mib):.2f}); MiB each: {head}")


# ---------------------------------------------------------------------------------------------
# Links: a collective's time alone

def ring_steps(op, n):
    return 2 * (n - 1) if op == "all_reduce" else (n if op in ("broadcast", "reduce") else n - 1)


def bus_factor(op, n):  # nccl-tests' busbw = algbw * factor
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    return 1.0 if op in ("broadcast", "reduce") else (n - 1) / n


class Link:
    """One level of links. A collective of op on n ranks alone costs
         base[op] + steps(op, n) * hop + f(op, n) * bytes / busbw[op]
    base: the measured per-collective latency (launch, synchronisation) less the ring's steps;
    hop: the latency of one ring step, which two ranks cannot separate from base (given, not
    measured: NCCL's own tuning model uses 3.4 us over NVLink and 9.6 us over a network for its
    Simple protocol); busbw: measured, with an optional factor per world size (scale). r_c, r_m:
    how fast compute and the collectives run while both share the GPU (1 = as fast as alone)."""

    def __init__(self, name, base_us, busbw, hop_us=0.0, r_c=1.0, r_m=1.0, source="",
                 scale=None):
        self.name, self.base_us, self.busbw, self.hop = name, dict(base_us), dict(busbw), hop_us
        for op in OPS:  # ops not measured: the all-reduce's (NCCL's model: one bus bandwidth)
            self.base_us.setdefault(op, self.base_us["all_reduce"])
            self.busbw.setdefault(op, self.busbw["all_reduce"])
        self.r_c, self.r_m, self.source = r_c, r_m, source
        self.scale = {int(k): v for k, v in (scale or {}).items()}  # world -> bandwidth factor

    def to_json(self):
        return {"base_us": self.base_us, "hop_us": self.hop, "busbw_gbps": self.busbw,
                "r_c": self.r_c, "r_m": self.r_m, "scale": self.scale, "source": self.source}

    @staticmethod
    def from_json(name, j):
        return Link(name, j["base_us"], j["busbw_gbps"], j.get("hop_us", 0.0), j.get("r_c", 1.0),
                    j.get("r_m", 1.0), j.get("source", ""), j.get("scale"))

    def bw(self, op, n):
        return self.busbw[op] * self.scale.get(n, 1.0)

    def time_ms(self, op, nbytes, n, like=None):
        """Alone on this level, n ranks (ring); `like`: the op whose latency and bandwidth apply."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        p = like or op
        return ((self.base_us[p] + ring_steps(op, n) * self.hop) * 1e-3 +
                bus_factor(op, n) * nbytes / (self.bw(p, n) * 1e6))


class Cluster:
    """N hosts x G GPUs: `intra` inside a host, `inter` between hosts (None when N = 1). Across
    hosts the step counts and the ring/tree choice follow NCCL's tuning model: a ring's steps
    that cross hosts pay the network's hop latency, the rest NVLink's; a tree (all-reduce only)
    takes 2((G-1) intra + log2 N inter) hops at 0.9 of the bandwidth, moving each byte twice.
    Between hosts the bus bandwidth is the network's per GPU times G (G rings, one NIC each)."""

    def __init__(self, hosts, gpus, intra, inter=None, tree=True):
        self.hosts, self.gpus, self.intra, self.inter, self.tree = hosts, gpus, intra, inter, tree

    @property
    def n(self):
        return self.hosts * self.gpus

    def sharing(self):  # (r_c, r_m) of the slowest level a collective crosses
        lk = self.inter if self.hosts > 1 else self.intra
        return lk.r_c, lk.r_m

    def time_ms(self, op, nbytes, like=None):
        """`op` alone on the cluster; `like`: the op whose latency and bandwidth apply."""
        n, N, G, p = self.n, self.hosts, self.gpus, like or op
        if n <= 1 or nbytes <= 0:
            return 0.0
        if N == 1:
            return self.intra.time_ms(op, nbytes, n, p)
        a, e = self.intra, self.inter
        busbw = min(a.bw(p, G) if G > 1 else 1e30, G * e.bw(p, N))
        base = max(a.base_us[p], e.base_us[p])
        steps, inter_steps = ring_steps(op, n), ring_steps(op, N)
        ring = ((base + (steps - inter_steps) * a.hop + inter_steps * e.hop) * 1e-3 +
                bus_factor(op, n) * nbytes / (busbw * 1e6))
        if op != "all_reduce" or not self.tree:
            return ring
        tree = ((base + 2 * ((G - 1) * a.hop + math.ceil(math.log2(N)) * e.hop)) * 1e-3 +
                2.0 * nbytes / (0.9 * busbw * 1e6))
        return min(ring, tree)


def read_comm_bench(paths):
    rows = []
    need = {"op", "bytes", "world", "median_us", "busbw_gbps"}
    for p in paths:
        rs = read_csv_rows(p)
        if not rs or not need <= set(rs[0]):
            die(f"{p} is not a comm_bench CSV with rows (needs columns "
                f"{', '.join(sorted(need))})")
        rows += rs
    return rows


def fit_latency_bandwidth(counts, loads, ys, intercept=False):
    """y = a * count + b * load with a >= 0, least squares in relative error (every row counts
    alike): a is a latency per call, b an inverse bandwidth. When a cannot be told apart from b
    (one row, or every row the same count, unless `intercept`: rows of one call each whose sizes
    differ, as comm_bench's) or would be negative, a = 0 and b alone is fitted."""
    w = [1.0 / (y * y) for y in ys]
    a11 = sum(wi * c * c for wi, c in zip(w, counts))
    a12 = sum(wi * c * x for wi, c, x in zip(w, counts, loads))
    a22 = sum(wi * x * x for wi, x in zip(w, loads))
    b1 = sum(wi * c * y for wi, c, y in zip(w, counts, ys))
    b2 = sum(wi * x * y for wi, x, y in zip(w, loads, ys))
    det = a11 * a22 - a12 * a12
    if (intercept or len(set(counts)) > 1) and abs(det) > 1e-12 * a11 * a22:
        a, b = (a22 * b1 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det
        if a >= 0:
            return a, b
    return 0.0, b2 / a22


def link_from_comm_bench(name, paths, dtype="fp32", min_bytes=0, hop=0.0):
    """Per op: time = base + steps(n) * hop + f(n) * bytes / busbw, fitted over sizes."""
    rows = [r for r in read_comm_bench(paths) if r.get("dtype", "fp32") == dtype and
            float(r["bytes"]) >= min_bytes]
    base, bw = {}, {}
    for op in OPS:
        rs = [r for r in rows if r["op"] == op]
        if not rs:
            continue
        n = int(rs[0]["world"])
        if any(int(r["world"]) != n for r in rs):
            die(f"{name}: {op} rows of several world sizes; give one world size per link")
        xs = [bus_factor(op, n) * float(r["bytes"]) for r in rs]
        ys = [float(r["median_us"]) for r in rs]
        a, b = fit_latency_bandwidth([1] * len(rs), xs, ys, intercept=True)
        base[op], bw[op] = max(0.0, a - ring_steps(op, n) * hop), 1e-3 / b if b > 0 else 1e30
    if "all_reduce" not in base:
        die(f"{name}: no all_reduce rows in {', '.join(paths)}")
    return Link(name, base, bw, hop, source="comm_bench " + " ".join(paths))


def cluster_time(cl, op, nbytes):
    """ZeRO-1's parameter all-gather is a group of one broadcast per rank (comm/
    nccl_communicator.cpp): an all-gather's bytes on each link, at the broadcast's bandwidth."""
    if op == "gather_by_broadcast":
        return cl.time_ms("all_gather", nbytes, "broadcast")
    return cl.time_ms(op, nbytes)


# ---------------------------------------------------------------------------------------------
# Two streams sharing one GPU

class Streams:
    """Compute runs the step's kernels in order; the comm stream runs what it was handed, in
    order. While both work, compute advances at rate r_c and the comm stream at r_m."""

    def __init__(self, r_c, r_m):
        self.t, self.r_c, self.r_m = 0.0, r_c, r_m
        self.queue, self.cur, self.done, self.busy = [], None, set(), 0.0

    def enqueue(self, key, ms):
        self.queue.append([key, ms])

    def _start(self):
        if self.cur is None and self.queue:
            self.cur = self.queue.pop(0)

    def _advance(self, dt, comm_rate):
        self.t += dt
        if self.cur is not None:
            self.busy += dt
            self.cur[1] -= dt * comm_rate
            if self.cur[1] <= 1e-12:
                self.done.add(self.cur[0])
                self.cur = None

    def compute(self, ms):
        left = ms
        while left > 1e-12:
            self._start()
            if self.cur is None:
                self._advance(left, 1.0)
                return
            dt = min(left / self.r_c, self.cur[1] / self.r_m)
            left -= dt * self.r_c
            self._advance(dt, self.r_m)

    def wait(self, key):
        """Compute idles until `key` is done; returns the time waited."""
        t0 = self.t
        while key not in self.done:
            self._start()
            if self.cur is None:
                raise RuntimeError(f"waiting for {key}, which was never handed to the comm stream")
            self._advance(self.cur[1], 1.0)
        return self.t - t0


class Run:
    """One configuration: model, cluster, strategy and one GPU's phase times (ms, per step)."""

    def __init__(self, model, cluster, fwd_ms, bwd_ms, opt_ms, strategy="bucketed", bucket_mb=25,
                 shard=False, bf16=False, accum=1, zero1="forward"):
        self.m, self.cl = model, cluster
        self.fwd, self.bwd, self.opt = fwd_ms, bwd_ms, opt_ms  # per micro-step (fwd, bwd)
        self.strategy, self.bucket_mb, self.shard, self.bf16 = strategy, bucket_mb, shard, bf16
        self.accum, self.zero1 = accum, zero1
        # The update streams 34 B per parameter (AdamW's 30 and the gradient norm's 4): the
        # memory bandwidth the conversions of bf16 reduction run at.
        self.hbm_gbps = 34.0 * model.params / (opt_ms * 1e6)

    def unit_ms(self, b, e, esize, shard_elems):
        """A unit's collective alone: an all-reduce, or with ZeRO-1 a reduce-scatter when the unit
        splits evenly over the shards, else one reduce per owning rank, grouped (comm/
        nccl_communicator.cpp): each link then carries the largest piece or its share of all."""
        cl, n = self.cl, self.cl.n
        if not self.shard:
            return cluster_time(cl, "all_reduce", (e - b) * esize)
        counts = [max(0, min(e, (r + 1) * shard_elems) - max(b, r * shard_elems))
                  for r in range(n)]
        if len(set(counts)) == 1:
            return cluster_time(cl, "reduce_scatter", (e - b) * esize)
        full = cluster_time(cl, "reduce", max(counts) * esize)
        spread = cluster_time(cl, "reduce_scatter", (e - b) * esize)
        return max(full, spread)

    def simulate(self, steps=3):
        m, cl, n = self.m, self.cl, self.cl.n
        if n == 1:
            t = self.accum * (self.fwd + self.bwd) + self.opt
            return {"step": t, "forward": self.accum * self.fwd, "backward": self.accum * self.bwd,
                    "comm": 0.0, "optimizer": self.opt, "comm_total": 0.0}
        units = plan_units(m, self.strategy, self.bucket_mb, n)
        eager = self.strategy in ("overlap", "bucketed")
        esize = 2 if self.bf16 else 4
        r_c, r_m = cl.sharing()
        flat = m.flat(n)
        bflops = m.backward_flops()
        bsum = sum(bflops)
        bwd_t = [self.bwd * x / bsum for x in bflops]
        ftasks = m.forward_tasks()
        fsum = sum(x[3] for x in ftasks)
        # ZeRO-1 update parts and the gathers forward waits for (by order of their gathers).
        shard_elems = flat // n
        parts = update_parts(shard_elems, self.bucket_mb, eager) if self.shard else []
        part_size = parts[0] if parts else 1
        need = []
        for _, a, b, _ in ftasks:
            last = -1
            for s in range(a // shard_elems, (max(b, a + 1) - 1) // shard_elems + 1):
                lo, hi = max(a, s * shard_elems), min(b, (s + 1) * shard_elems)
                if hi <= lo:
                    continue
                first_part = (lo - s * shard_elems) // part_size
                # parts are updated and gathered from the end of the shard to its start
                last = max(last, len(parts) - 1 - first_part)
            need.append(last)
        conv_ms = lambda elems, bytes_per: elems * bytes_per / (self.hbm_gbps * 1e6)

        s = Streams(r_c, r_m)
        res = None
        for step in range(steps):
            t0, busy0 = s.t, s.busy
            ph = {"forward": 0.0, "backward": 0.0, "comm": 0.0, "optimizer": 0.0}

            def work(phase, ms):
                a = s.t
                s.compute(ms)
                ph[phase] += s.t - a

            def launch(u):
                b, e, _, _ = units[u]
                if self.bf16:
                    s.enqueue(("pre", step, u), conv_ms(e - b, 6))
                s.enqueue(("c", step, u), self.unit_ms(b, e, esize, shard_elems))
                if self.bf16:
                    s.enqueue(("post", step, u), conv_ms(e - b, 6 if not self.shard else 6 / n))

            last_key = lambda u: ("post" if self.bf16 else "c", step, u)
            for micro in range(self.accum):
                reduce = micro == self.accum - 1
                for k, (_, _, _, fl) in enumerate(ftasks):
                    if micro == 0 and self.shard and self.zero1 == "forward" and need[k] >= 0:
                        key = ("g", step - 1, need[k])
                        if step > 0:
                            ph["comm"] += s.wait(key)
                    work("forward", self.fwd * fl / fsum)
                next_u = 0
                for i, ms in enumerate(bwd_t):
                    work("backward", ms)
                    if reduce and eager:
                        while next_u < len(units) and units[next_u][3] <= i:
                            launch(next_u)
                            next_u += 1
                if reduce:
                    while next_u < len(units):
                        launch(next_u)
                        next_u += 1
            for u in range(len(units)):
                ph["comm"] += s.wait(last_key(u))
            if not self.shard:
                work("optimizer", self.opt)
            else:
                for j, p in enumerate(parts):
                    work("optimizer", self.opt / n * p / shard_elems)
                    if self.zero1 != "after":
                        s.enqueue(("g", step, j), cluster_time(cl, "gather_by_broadcast",
                                                                p * n * 2))
                if self.zero1 == "after":
                    for j, p in enumerate(parts):
                        s.enqueue(("g", step, j), cluster_time(cl, "gather_by_broadcast",
                                                                p * n * 2))
                if self.zero1 in ("after", "update"):
                    for j in range(len(parts)):
                        ph["comm"] += s.wait(("g", step, j))
            res = dict(ph, step=s.t - t0, comm_total=s.busy - busy0)
        return res


def read_csv_rows(path):
    try:
        with open(path) as fh:
            return list(csv.DictReader(fh))
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
