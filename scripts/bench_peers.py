#!/usr/bin/env python3
"""Peregrine and its peers on the same data, the same 2 cores, in one run (scripts/bench-peers.sh
prepares the data and the peers and calls this). Each workload runs `--reps` times, Peregrine and
its peers alternating (which goes first alternates too); the table gives medians and ratios, and
the roofline figures (FMA peak, STREAM triad) measured in the same run.

    bench_peers.py --peregrine target/release/peregrine --data target/bench-peers --reps 5
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
sys.path.insert(0, PEERS)
import pgd  # noqa: E402

# Flops of softmax 784x10 per sample: the forward products and the gradient's outer product, a
# multiply-add (2 flops) per weight each.
SOFTMAX_FLOPS = 4 * 784 * 10
# Multiply-adds of the MLP 784-128-10 per sample, forward and backward (weight gradients of both
# layers and the hidden layer's input gradient), 2 flops each.
MLP_FLOPS = 2 * (784 * 128 + 128 * 10) + 2 * (128 * 10 + 128 * 10 + 784 * 128)


def pgd_shape(path):
    """(rows, nonzeros) from a Peregrine dataset's header (the peers' reader, `peers/pgd.py`)."""
    _kind, rows, _cols, nnz, *_ = pgd.header(path)
    return rows, nnz


class Hung(Exception):
    """A command that ran past its time limit (it and its children were killed)."""


def run(cmd, env=None, timeout=None):
    """Runs cmd, returns its stdout; exits naming the command if it failed. Past `timeout` seconds
    the command and every process it started are killed and `Hung` is raised."""
    # Its own session: a hung PyTorch DDP run leaves no worker behind when its group is killed.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise Hung(f"`{shlex.join(cmd)}` still running after {timeout:.0f} s: killed") from None
    if p.returncode != 0:
        sys.exit(f"bench_peers: `{shlex.join(cmd)}` failed ({p.returncode}):\n{out[-2000:]}{err[-4000:]}")
    return out


def peer_env():
    """The peers' environment: OpenBLAS's machine overrides removed (they slow it on some hosts)."""
    env = dict(os.environ)
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def last_json(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class Bench:
    def __init__(self, a):
        self.a = a
        self.py = a.python
        self.results = {}
        self.hung = []

    def peregrine(self, name, flags, one_rank=False):
        """One Peregrine run under `mpirun -n 2` (`one_rank`: one rank of 2 threads); its
        summary.json."""
        d = os.path.join(self.a.data, "runs", name)
        launcher = self.a.launcher_one if one_rank else self.a.launcher
        cmd = launcher.split() + [self.a.peregrine, "train", "-q", "--checkpoint-every", "0",
                                  "--force", "--run-dir", d] + flags
        run(cmd)
        with open(os.path.join(d, "summary.json")) as f:
            return json.load(f)

    def peer(self, script, args):
        """One peer run; a run that hangs is killed after `--peer-timeout` seconds and run again
        (up to 3 tries), and counted (libmf 0.9.2's scheduler was seen to deadlock: both workers
        waiting in `Scheduler::put_job`, the main thread joining them, no CPU used)."""
        cmd = [self.py, os.path.join(PEERS, script)] + args
        for attempt in range(1, 4):
            try:
                return last_json(run(cmd, env=peer_env(), timeout=self.a.peer_timeout))
            except Hung as e:
                self.hung.append(f"{script}: {e}")
                print(f"  {script} hung (try {attempt} of 3): {e}", flush=True)
        sys.exit(f"bench_peers: {script} hung 3 times in a row")

    def record(self, key, value):
        self.results.setdefault(key, []).append(value)

    def alternate(self, sides):
        """Runs each (name, fn) of sides once per repetition, rotating which goes first."""
        for rep in range(self.a.reps):
            order = sides[rep % len(sides):] + sides[:rep % len(sides)]
            for name, fn in order:
                t0 = time.perf_counter()
                fn()
                print(f"  rep {rep + 1}: {name} ({time.perf_counter() - t0:.1f} s)", flush=True)

    def median(self, key, field=None):
        vals = [v if field is None else v.get(field) for v in self.results.get(key, [])]
        vals = [v for v in vals if v is not None]
        if not vals:
            return None
        return statistics.median(vals)


def fmt(v, spec, none="not reached"):
    return none if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def sps_key(model, batch):
    """The results' key of `model`'s throughput at `batch`."""
    return f"{model}-sps" if batch == 128 else f"{model}-sps-{batch}"


def roofline(b, threads=2):
    """`peregrine bench roofline` on `threads` threads: FMA peak, STREAM triad and the line round
    trip between two CPUs, as JSON."""
    return json.loads(run([b.a.peregrine, "bench", "roofline", "--threads", str(threads), "--json"]))


def lines(ns):
    """Line round trips (ns, None where not measured) as text."""
    return ", ".join("-" if v is None else f"{v:.0f}" for v in ns) + " ns"


def spread(achieved, roofs):
    """Each run's achieved figure against the roof measured right before it, as `median % of each
    run's own (runs: a, b, c %; spread lo-hi)`."""
    fractions = [100 * x / r for x, r in zip(achieved, roofs)]
    return (f"{statistics.median(fractions):.0f} % of each run's own (runs: "
            f"{', '.join(f'{f:.1f}' for f in fractions)} %; spread {min(fractions):.0f}-{max(fractions):.0f})")


def triad_before(b, key):
    """The STREAM triad right before one of Peregrine's runs, recorded under `key`'s `-triad`
    (and the FMA peak under `-peak`): a noisy host's bandwidth moves between minutes of one run."""
    roof = roofline(b)
    b.record(f"{key}-triad", roof["triad_gbs"])
    b.record(f"{key}-peak", roof["fma_gflops"])
    return roof


def throughput(b, fm, model, batch, rows, peak_each=False):
    """Samples per second of `model` at a global `batch` over 2 epochs, Peregrine against PyTorch
    DDP and single-process PyTorch, alternated; appends the table row; Peregrine's median. With
    `peak_each`, the FMA peak and the triad are measured right before each of Peregrine's runs
    (recorded under the key's `-peak` and `-triad`): the machine's peak moves between minutes of one run as much as the
    throughput does, so a fraction of peak pairs figures taken seconds apart. The MLP runs twice
    on Peregrine's side: 2 ranks of one thread, and one rank of 2 threads splitting the hidden
    units (`--split units`, under the key's `-units`); the row gives both."""
    print(f"== {model}, Fashion-MNIST: throughput (batch {batch}, 2 epochs)", flush=True)
    key = sps_key(model, batch)
    common = ["--model", model, "--data", fm, "--batch", str(batch)]
    peer = ["--data", fm, "--model", model, "--epochs", "2", "--batch", str(batch)]

    def ours():
        if peak_each:
            roof = triad_before(b, key)
            # How far apart the host has put the two CPUs right now (it moves them: 50-85 ns
            # between neighbours, 340-420 ns between distant cores, seen within one hour).
            b.record(f"{key}-line", roof.get("line_round_trip_ns"))
        b.record(f"{key}-peregrine", b.peregrine(key, common + ["--epochs", "2", "--eval-every", "1000000"])[
            "samples_per_second"])

    def units():
        if peak_each:
            b.record(f"{key}-units-peak", roofline(b)["fma_gflops"])
        b.record(f"{key}-units", b.peregrine(f"{key}-units", common + [
            "--epochs", "2", "--eval-every", "1000000", "--split", "units"], one_rank=True)["samples_per_second"])

    split = model == "mlp"
    b.alternate([("peregrine", ours)] + ([("peregrine units", units)] if split else []) + [
        ("pytorch ddp", lambda: b.record(f"{key}-ddp", b.peer("torch_fmnist.py", peer + ["--mode", "ddp"])[0])),
        ("pytorch single", lambda: b.record(f"{key}-single", b.peer("torch_fmnist.py", peer + ["--mode", "single"])[0])),
    ])
    sps = b.median(f"{key}-peregrine")
    ddp = b.median(f"{key}-ddp", "samples_per_second")
    one = b.median(f"{key}-single", "samples_per_second")
    rows.append((f"{model} samples/s, batch {batch}" + (", 2 ranks x 1 thread" if split else ""), fmt(sps, ",.0f"),
                 f"DDP {fmt(ddp, ',.0f')}; 1 process x 2 threads {fmt(one, ',.0f')}",
                 f"{fmt(ratio(sps, ddp), '.1f')}x DDP, {fmt(ratio(sps, one), '.1f')}x single"))
    if split:
        u = b.median(f"{key}-units")
        rows.append((f"{model} samples/s, batch {batch}, 1 rank x 2 threads splitting the hidden units",
                     fmt(u, ",.0f"), f"DDP {fmt(ddp, ',.0f')}; 1 process x 2 threads {fmt(one, ',.0f')}",
                     f"{fmt(ratio(u, ddp), '.1f')}x DDP, {fmt(ratio(u, one), '.1f')}x single"))
    return sps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peregrine", required=True)
    p.add_argument("--launcher", default="mpirun -n 2", help="how Peregrine's 2 ranks start")
    p.add_argument("--launcher-one", default="mpirun -n 1 --bind-to none",
                   help="how one Peregrine rank of 2 threads starts (the MLP split by units)")
    p.add_argument("--python", default=sys.executable, help="the peers' Python")
    p.add_argument("--data", required=True, help="directory of the prepared datasets")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", default="roofline,fmnist,mf,lr,scale",
                   help="parts to run: roofline, fmnist, mf, lr, scale (comma-separated)")
    p.add_argument("--big", action="store_true", help="also the 10M x 1M sparse set (sparse-10m.pgd)")
    p.add_argument("--peer-timeout", type=float, default=300,
                   help="seconds before a peer's run counts as hung, is killed and run again (default 300)")
    p.add_argument("--out", default=None, help="where table.md and results.json go (default: --data)")
    p.add_argument("--plot-with", default=None,
                   help="the peregrine that draws roofline.png/.svg (default: --peregrine)")
    a = p.parse_args()
    out = a.out or a.data
    parts = set(a.only.split(","))
    b = Bench(a)
    fm = os.path.join(a.data, "fm-train.pgd")
    rows = []
    roof = None
    # The roofline plot's points: (label, FLOP per byte moved, GFLOP/s achieved).
    points = []

    if "roofline" in parts:
        print("== roofline: FMA peak and STREAM triad, 2 threads", flush=True)
        roof = roofline(b)
        b.results["roofline"] = roof
        print(f"  {roof}", flush=True)

    if "fmnist" in parts:
        for model in ("softmax", "mlp"):
            # The MLP also at batch 512: the issue's FMA-peak target is for batches of 128 and up.
            for batch in (128, 512) if model == "mlp" else (128,):
                sps = throughput(b, fm, model, batch, rows, peak_each=roof is not None)
                if model == "mlp" and roof:
                    key = sps_key(model, batch)
                    # The peak of the products' own instructions (AVX-512 where the CPU has it); on
                    # such a CPU the build's f32x8 peak too, the one earlier runs were judged on.
                    isa = roof.get("isa", "f32x8")
                    narrow = roof.get("f32x8_fma_gflops")
                    for how, runs, peak_key in (("2 ranks x 1 thread", f"{key}-peregrine", f"{key}-peak"),
                                                ("1 rank x 2 threads, units split", f"{key}-units",
                                                 f"{key}-units-peak")):
                        g = b.median(runs) * MLP_FLOPS / 1e9
                        if runs.endswith("peregrine"):
                            # Per sample its 3136 bytes of features (the weights stay in cache).
                            points.append((f"MLP batch {batch}", MLP_FLOPS / 3136, g))
                        # Each run against the peak measured just before it; the median of those.
                        peaks = b.results[peak_key]
                        each = [100 * s * MLP_FLOPS / 1e9 / p for s, p in zip(b.results[runs], peaks)]
                        also = (f"; {100 * g / narrow:.0f} % of the f32x8 peak ({narrow:.1f})" if narrow else "")
                        line = (f"; line round trip before each: {lines(b.results.get(f'{key}-line', []))}"
                                if runs.endswith("peregrine") else "")
                        rows.append((f"MLP GFLOP/s, batch {batch}, {how} (0.41 MFLOP per sample)", f"{g:.1f}",
                                     f"{isa} FMA peak {roof['fma_gflops']:.1f} at the start; {min(peaks):.1f}-"
                                     f"{max(peaks):.1f} before each run",
                                     f"{100 * g / roof['fma_gflops']:.0f} % of the first; {statistics.median(each):.0f} % "
                                     f"of each run's own (runs: {', '.join(f'{e:.1f}' for e in each)} %{line}){also}"))
                if model == "softmax" and roof:
                    key = sps_key(model, batch)
                    gbs = sps * 784 * 4 / 1e9
                    # Per sample its flops over the 3136 bytes of its features.
                    points.append(("softmax batch 128", SOFTMAX_FLOPS / 3136, sps * SOFTMAX_FLOPS / 1e9))
                    triads = b.results[f"{key}-triad"]
                    each = spread([x * 784 * 4 / 1e9 for x in b.results[f"{key}-peregrine"]], triads)
                    rows.append(("softmax features read, GB/s (3136 B per sample)", f"{gbs:.1f}",
                                 f"triad {roof['triad_gbs']:.1f} at the start; {min(triads):.1f}-{max(triads):.1f} "
                                 f"before each run", f"{100 * gbs / roof['triad_gbs']:.0f} % of the first; {each}"))
            target = 0.40
            # Evaluations every ~15,000 samples on every side: 117 iterations of 128 (the peers, and
            # Peregrine's MLP), 59 of 256 (Peregrine's softmax, its default batch).
            every = "117" if model == "mlp" else "59"
            print(f"== {model}, Fashion-MNIST: time to training loss {target}", flush=True)
            b.alternate([
                ("peregrine", lambda: b.record(f"{model}-ttt-peregrine", b.peregrine(
                    f"{model}-ttt", ["--model", model, "--data", fm, "--epochs", "10", "--eval-every", every,
                                     "--target-loss", str(target)]))),
                ("pytorch ddp", lambda: b.record(f"{model}-ttt-ddp", b.peer("torch_fmnist.py", [
                    "--data", fm, "--model", model, "--mode", "ddp", "--epochs", "10", "--eval-every", "117",
                    "--target-loss", str(target)])[0])),
                ("pytorch single", lambda: b.record(f"{model}-ttt-single", b.peer("torch_fmnist.py", [
                    "--data", fm, "--model", model, "--mode", "single", "--epochs", "10", "--eval-every", "117",
                    "--target-loss", str(target)])[0])),
            ])
            t = b.median(f"{model}-ttt-peregrine", "time_to_target")
            d = b.median(f"{model}-ttt-ddp", "time_to_target")
            s = b.median(f"{model}-ttt-single", "time_to_target")
            rows.append((f"{model} seconds to training loss {target}", fmt(t, ".2f"),
                         f"DDP {fmt(d, '.2f')}; single {fmt(s, '.2f')}",
                         f"{fmt(ratio(d, t), '.1f')}x faster than DDP, {fmt(ratio(s, t), '.1f')}x than single"))

    if "mf" in parts:
        print("== MF k=40, MovieLens-100k 90/10, 20 epochs", flush=True)
        tr, te = os.path.join(a.data, "ml-train.pgd"), os.path.join(a.data, "ml-test.pgd")
        epochs = 20

        def mf_peregrine():
            # An epoch's time on both sides is the marginal one, (T(20) - T(1)) / 19, as
            # libmf_ratings.py takes libmf's (whose fit includes its setup).
            def one(n):
                return b.peregrine(f"mf-{n}", ["--model", "mf", "--k", "40", "--data", tr, "--eval", te,
                                               "--epochs", str(n), "--eval-every", "1000000", "--no-intercept"])
            if roof:
                triad_before(b, "mf")
            s1, s = one(1), one(epochs)
            s["epoch_seconds"] = (s["train_seconds"] - s1["train_seconds"]) / (epochs - 1)
            b.record("mf-peregrine", s)

        b.alternate([
            ("peregrine", mf_peregrine),
            ("libmf", lambda: b.record("mf-libmf", b.peer("libmf_ratings.py", [
                "--train", tr, "--test", te, "--k", "40", "--iters", str(epochs), "--threads", "2"])[0])),
        ])
        ms = 1000 * b.median("mf-peregrine", "epoch_seconds")
        rmse = statistics.median(s["evals"][-1]["metric"] for s in b.results["mf-peregrine"])
        lms = 1000 * b.median("mf-libmf", "epoch_seconds")
        lrmse = b.median("mf-libmf", "rmse")
        # For the figures of earlier runs: the whole fit over the epochs (libmf's setup and first
        # fit's start-up in it; Peregrine's training time has no setup).
        whole = statistics.median(1000 * s["train_seconds"] / epochs for s in b.results["mf-peregrine"])
        lwhole = 1000 * b.median("mf-libmf", "fit_epoch_seconds")
        rows.append(("MF ms per epoch (test RMSE)", f"{ms:.2f} ({rmse:.4f})", f"libmf {lms:.2f} ({lrmse:.4f})",
                     f"{ms / lms:.2f}x libmf's time, RMSE {rmse - lrmse:+.4f}"))
        rows.append((f"MF ms per epoch, whole training over {epochs} (libmf's setup in its fit)", f"{whole:.2f}",
                     f"libmf {lwhole:.2f}", f"{whole / lwhole:.2f}x"))
        if roof:
            # Per rating: its 12 bytes (user, item, rating) and the user's and the item's rows, each
            # read and written once (k = 40 factors and the 2 G's of adaptive rates, no biases).
            n, _ = pgd_shape(tr)
            per = 12 + 2 * 2 * 4 * (40 + 2)
            gbs = n * per / (ms / 1000) / 1e9
            each = spread([n * per / r["epoch_seconds"] / 1e9 for r in b.results["mf-peregrine"]],
                          b.results["mf-triad"])
            # Per rating: the dot product (2k) and each of the two rows' gradient and step (4k each).
            points.append(("MF k=40", 10 * 40 / per, n * 10 * 40 / (ms / 1000) / 1e9))
            rows.append((f"MF bytes touched, GB/s ({per} B per rating: the rating, and its user's and item's "
                         f"rows read and written)", f"{gbs:.1f}", f"triad {roof['triad_gbs']:.1f} at the start",
                         f"{100 * gbs / roof['triad_gbs']:.0f} % of the first; {each} (the rows are "
                         f"mostly cache hits: the model is 441 KB)"))

    if "lr" in parts:
        target = 0.345
        print(f"== LR, Adult: time to training log-loss {target}", flush=True)
        ad = os.path.join(a.data, "adult.pgd")

        def lr_peregrine():
            if roof:
                triad_before(b, "lr")
            b.record("lr-peregrine", b.peregrine("lr", ["--model", "lr", "--data", ad, "--epochs", "30",
                                                       "--eval-every", "5", "--target-loss", str(target)]))

        b.alternate([
            ("peregrine", lr_peregrine),
            ("vw, scikit-learn", lambda: b.record("lr-peers", b.peer("lr_sparse.py", [
                "--data", ad, "--target", str(target), "--work", os.path.join(a.data, "vw")]))),
        ])
        t = b.median("lr-peregrine", "time_to_target")
        loss = statistics.median(s["evals"][-1]["loss"] for s in b.results["lr-peregrine"])
        peers = {}
        for rep in b.results["lr-peers"]:
            for r in rep:
                peers.setdefault(r["tool"], []).append(r)
        cells = []
        for tool, rs in peers.items():
            tt = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
            m = statistics.median(tt) if tt else None
            cells.append((tool, m, statistics.median(r["final_loss"] for r in rs), rs[0]["steps"], rs[0]["unit"]))
        rows.append((f"LR Adult, seconds to log-loss {target} (final)", f"{fmt(t, '.3f')} ({loss:.4f})",
                     "; ".join(f"{tool} {fmt(m, '.3f')} ({l:.4f}, {s} {u})" for tool, m, l, s, u in cells),
                     ", ".join(f"{fmt(ratio(m, t), '.1f')}x faster than {tool}" for tool, m, _, _, _ in cells)))
        if roof:
            # Per row: its offset (8 B), label (4 B) and nonzeros (index and value, 8 B each), read once.
            n, nnz = pgd_shape(ad)
            per = (8 * nnz + 12 * n) / n
            sps = statistics.median(s["samples"] / s["train_seconds"] for s in b.results["lr-peregrine"])
            gbs = sps * per / 1e9
            each = spread([r["samples"] / r["train_seconds"] * per / 1e9 for r in b.results["lr-peregrine"]],
                          b.results["lr-triad"])
            # Per nonzero: the dot product's and the gradient's multiply-add, 4 FLOP.
            points.append(("LR Adult", 4 * nnz / n / per, sps * 4 * nnz / n / 1e9))
            rows.append((f"LR Adult features read, GB/s ({per:.0f} B per row)", f"{gbs:.1f}",
                         f"triad {roof['triad_gbs']:.1f} at the start", f"{100 * gbs / roof['triad_gbs']:.0f} % of "
                         f"the first; {each}"))

    if "scale" in parts:
        # The 10M-row set also hashed into 2^24 buckets (--hash-bits: pulls and pushes by key).
        sets = [("2M x 100k", "sparse-2m.pgd", [])] + ([
            ("10M x 1M", "sparse-10m.pgd", []),
            ("10M x 2^24 hashed", "sparse-10m.pgd", ["--hash-bits", "24"]),
        ] if a.big else [])
        for label, f, extra in sets:
            # Peregrine's default batch for LR (4096) and a large one (100,000).
            for batch in ("4096", "100000"):
                key = f"scale-{f}-{batch}" + ("-hashed" if extra else "")
                print(f"== sparse LR at scale, {label}, batch {batch}, 1 epoch", flush=True)
                b.alternate([("peregrine", lambda: b.record(key, b.peregrine(
                    key, ["--model", "lr", "--data", os.path.join(a.data, f), "--epochs", "1",
                          "--batch", batch, "--eval-every", "1000000"] + extra)))])

                def per_rank(field):
                    return statistics.median(sum(r[field] for r in s["per_rank"]) / len(s["per_rank"])
                                             for s in b.results[key])
                comm, comp = per_rank("comm"), per_rank("compute")
                rows.append((f"sparse LR {label}, batch {batch}: communication / computation per rank",
                             f"{comm / comp:.2f}", f"comm {comm:.3f} s, compute {comp:.3f} s per epoch", ""))

    table = ["| workload | Peregrine | peers | ratio |", "|---|---|---|---|"]
    table += [f"| {w} | {m} | {pe} | {r} |" for w, m, pe, r in rows]
    versions = sorted({r.get("peer", "") + ": " + r.get("flags", "")
                       for v in b.results.values() if isinstance(v, list)
                       for x in v for r in (x if isinstance(x, list) else [x]) if isinstance(r, dict) and "peer" in r})
    text = "\n".join(table) + "\n\nPeers, versions and flags:\n" + "\n".join(f"- {v}" for v in versions) + "\n"
    if roof:
        narrow = roof.get("f32x8_fma_gflops")
        narrow = (f"; f32x8 FMA peak {roof['f32x8_fma_gflops_1']:.1f} GFLOP/s on 1 thread, {narrow:.1f} on 2"
                  if narrow else "")
        text += (f"\nRoofline (same run): {roof['simd']}; FMA peak {roof['fma_gflops_1']:.1f} GFLOP/s on 1 thread, "
                 f"{roof['fma_gflops']:.1f} on 2 ({roof['vector']}){narrow}; STREAM triad {roof['triad_gbs']:.1f} GB/s "
                 f"on 2 threads; one cache line's round trip between the two CPUs "
                 f"{lines([roof.get('line_round_trip_ns')])}")
        if roof.get("handoff_read_gbs"):
            text += (f"; {roof['handoff_bytes'] >> 10} KiB handed between them, both at once: read at "
                     f"{roof['handoff_read_gbs']:.1f} GB/s ({roof['handoff_local_gbs']:.1f} from the own cache), "
                     f"copied into lines the other read at {roof['handoff_copy_gbs']:.1f} GB/s")
        text += ".\n"
        if points:
            os.makedirs(out, exist_ok=True)
            stem = os.path.join(out, "roofline")
            # The roof: the highest FMA peak of the run (the one at its start and those measured
            # before each of Peregrine's runs: a busy host's single figures were seen at half the
            # others).
            peak = max([roof["fma_gflops"]] + [p for k, v in b.results.items() if k.endswith("-peak") for p in v])
            run([a.plot_with or a.peregrine, "bench", "roofline", "--roof", f"{peak},{roof['triad_gbs']}",
                 "--plot", stem] + [f"--point={l}={i:.4g},{g:.4g}" for l, i, g in points])
            b.results["roofline_points"] = points
            text += "\nThe roofline of this run, each workload on it: `roofline.png`, `roofline.svg`.\n"
    if b.hung:
        text += (f"\nPeer runs that hung, were killed after {a.peer_timeout:.0f} s and ran again "
                 f"({len(b.hung)}):\n" + "\n".join(f"- {h}" for h in b.hung) + "\n")
    b.results["hung"] = b.hung
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(b.results, f, indent=1, default=str)
    print("\n" + text)
    print(f"written: {os.path.join(out, 'table.md')}, {os.path.join(out, 'results.json')}")


if __name__ == "__main__":
    main()
