//! Multi-rank integration tests of Peregrine. The tests live in `tests/`; this library holds what
//! they share: how to launch an SPMD program under `mpirun`, and the checks the SPMD programs and
//! the local tests both run.

use std::path::Path;
use std::process::{Command, Output};

/// Every synchronization scheme, each with a parameter that runs on 2 ranks: what the tests run
/// "under every scheme".
pub const SCHEMES: [&str; 13] = [
    "bsp",
    "ssp:2",
    "asp",
    "dynsgd:2",
    "backup:1",
    "backup-dynamic",
    "lb-bsp",
    "lb-bsp:narx",
    "speculative",
    "flexrr:2",
    "falcon",
    "falcon:slack:2",
    "dbw:ring",
];

/// The MPI launcher to use: `$PEREGRINE_MPIRUN` (e.g. `mpirun.mpich`), else `mpirun`.
pub fn mpirun() -> String {
    std::env::var("PEREGRINE_MPIRUN").unwrap_or_else(|_| "mpirun".to_owned())
}

/// `program args` under `mpirun -n ranks`, with the environment OpenMPI needs here (one-sided
/// components that work, root, oversubscription) unless the caller set it already.
pub fn mpirun_command(ranks: usize, program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(mpirun());
    cmd.arg("-n").arg(ranks.to_string()).arg(program).args(args);
    for (k, v) in [
        ("OMPI_MCA_osc", "sm,pt2pt"),
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    cmd
}

/// OpenMPI's UCX one-sided path (what InfiniBand clusters use) over UCX transports `tls`, e.g.
/// `tcp,self` (between nodes, no RDMA) or `sm,self` (one node): `osc` and `pml` UCX, with the UCX
/// components allowed on transports other than InfiniBand (by default OpenMPI 4.1 selects them
/// only when an `mlx*` device is present).
pub fn with_ucx<'a>(cmd: &'a mut Command, tls: &str) -> &'a mut Command {
    cmd.env("OMPI_MCA_osc", "ucx")
        .env("OMPI_MCA_pml", "ucx")
        .env("OMPI_MCA_pml_ucx_tls", "any")
        .env("OMPI_MCA_pml_ucx_devices", "any")
        .env("UCX_TLS", tls)
}

/// Runs `program args` under `mpirun -n ranks` ([`mpirun_command`]) to completion.
pub fn mpirun_n(ranks: usize, program: &Path, args: &[&str]) -> Output {
    let launcher = mpirun();
    mpirun_command(ranks, program, args)
        .output()
        .unwrap_or_else(|e| panic!("cannot start `{launcher}`: {e} (is MPI installed?)"))
}

/// The settings of the SPMD programs that take `[--backend local|mpi] [--ranks N] [--iterations
/// K] [--threads T]`.
#[derive(Clone, Copy, Debug)]
pub struct SpmdArgs {
    /// The transport.
    pub backend: peregrine_transport::Backend,
    /// Ranks of the local backend.
    pub ranks: usize,
    /// Iterations of the check.
    pub iterations: u64,
    /// Threads a rank.
    pub threads: usize,
}

impl SpmdArgs {
    /// Parses `program`'s command line over these defaults; `Err`: the message for a bad argument.
    pub fn parse(program: &str, mut a: SpmdArgs) -> Result<SpmdArgs, String> {
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let v = args.next().unwrap_or_default();
            let ok = match flag.as_str() {
                "--backend" => v.parse().map(|b| a.backend = b).is_ok(),
                "--ranks" => v.parse().map(|n| a.ranks = n).is_ok(),
                "--iterations" => v.parse().map(|n| a.iterations = n).is_ok(),
                "--threads" => v.parse().map(|n| a.threads = n).is_ok(),
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "error: bad argument `{flag} {v}`; usage: {program} [--backend local|mpi] [--ranks N] \
                     [--iterations K] [--threads T]"
                ));
            }
        }
        Ok(a)
    }
}

/// Runs an SPMD test program's `body` on every rank of `backend` (`ranks` threads for the local
/// backend, this process's MPI rank otherwise): exit 0 iff every rank returned `true`.
pub fn run_spmd(
    backend: peregrine_transport::Backend,
    ranks: usize,
    body: impl Fn(peregrine_transport::Transport) -> bool + Sync,
) -> std::process::ExitCode {
    use peregrine_transport::{run_local, Backend, Transport};
    let ok = match backend {
        Backend::Local => run_local(ranks, body).map(|oks| oks.into_iter().all(|ok| ok)),
        Backend::Mpi => Transport::mpi().map(body),
    }
    .unwrap_or_else(|e| {
        eprintln!("error: {e}");
        false
    });
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// Panics unless the `conformance` SPMD program's output says every case passed on `ranks` MPI
/// ranks: the summary line, every case reported `ok` by rank 0, none failed.
pub fn assert_conformance_passed(stdout: &str, ranks: usize, what: &str) {
    let expected = format!("conformance: all cases passed on {ranks} ranks (mpi)");
    assert!(stdout.contains(&expected), "{what}: missing `{expected}` in:\n{stdout}");
    for case in peregrine_transport::conformance::CASES {
        assert!(
            stdout.lines().any(|l| l.starts_with("ok") && l.contains(case.name)),
            "{what}: case {} not reported:\n{stdout}",
            case.name
        );
    }
    assert!(!stdout.contains("FAIL"), "{what}:\n{stdout}");
}

/// Panics with the child's output unless it exited with status 0.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub mod problems;
pub mod training;

pub mod stealing {
    //! Chunk queues under concurrency: each chunk of every iteration is handed out exactly once.
    //!
    //! Every rank fills its queue with a different number of chunks; `threads` threads per rank
    //! take chunks from their own queue and, once it is empty, take over half of what is left in
    //! another rank's queue, until every queue is empty. Rank 0 is slow (it spins on each of its
    //! chunks), so others take over from it. Each taken chunk adds 1 to its slot of a counting
    //! window; at the end every slot must equal the number of iterations.

    use std::sync::atomic::{AtomicU64, Ordering};

    use peregrine_core::queue::ChunkQueues;
    use peregrine_transport::{ReduceOp, ShardMap, Transport, Window};

    /// Chunks of rank `r` in each iteration.
    fn chunks_of(r: usize) -> u32 {
        40 + 23 * r as u32
    }

    /// What one rank saw.
    #[derive(Debug, Default)]
    pub struct Report {
        /// Chunks this rank's threads took from other ranks, all iterations.
        pub stolen: u64,
        /// Chunks this rank's threads took from its own queue.
        pub own: u64,
    }

    /// Runs the check on this rank (collective). `Err` says what went wrong.
    pub fn exactly_once(t: &Transport, iterations: u64, threads: usize) -> Result<Report, String> {
        let e = |e: peregrine_transport::Error| e.to_string();
        let n = t.world_size();
        let q = ChunkQueues::new(t).map_err(e)?;
        let lens: Vec<usize> = (0..n).map(|r| chunks_of(r) as usize).collect();
        let offsets: Vec<usize> = lens.iter().scan(0, |a, &l| Some(std::mem::replace(a, *a + l))).collect();
        let seen: Window<u64> = t.alloc_window("seen", &ShardMap::from_lens(lens.clone())).map_err(e)?;
        let (stolen, own) = (AtomicU64::new(0), AtomicU64::new(0));
        for it in 0..iterations {
            q.fill(it, chunks_of(t.rank())).map_err(e)?;
            t.barrier().map_err(e)?;
            let work = |thread: usize| -> Result<(), String> {
                let mut victim = (t.rank() + 1 + thread) % n;
                loop {
                    let (from, got) = match q.take_own(1 + (thread as u32 % 3)).map_err(e)? {
                        Some(r) => (t.rank(), r),
                        None => {
                            let mut found = None;
                            for _ in 0..n {
                                victim = (victim + 1) % n;
                                if victim != t.rank() {
                                    if let Some((tag, r)) = q.steal(victim, 0.5, 8).map_err(e)? {
                                        if tag != peregrine_core::queue::tag(it) {
                                            return Err(format!(
                                                "took chunks tagged {tag} in iteration {it}"
                                            ));
                                        }
                                        found = Some((victim, r));
                                        break;
                                    }
                                }
                            }
                            match found {
                                Some(f) => f,
                                None if (0..n)
                                    .map(|r| q.remaining(r))
                                    .sum::<Result<u32, _>>()
                                    .map_err(e)?
                                    == 0 =>
                                {
                                    return Ok(())
                                }
                                None => continue,
                            }
                        }
                    };
                    if from == t.rank() { &own } else { &stolen }
                        .fetch_add(u64::from(got.len() as u32), Ordering::Relaxed);
                    if t.rank() == 0 {
                        // The straggler.
                        let until = std::time::Instant::now()
                            + std::time::Duration::from_micros(200 * got.len() as u64);
                        while std::time::Instant::now() < until {
                            std::hint::spin_loop();
                        }
                    }
                    let ones = vec![1u64; got.len()];
                    let start = offsets[from] + got.start as usize;
                    seen.write_scope(|s| s.accumulate(start, &ones)).map_err(e)?;
                }
            };
            let results: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads).map(|th| s.spawn(move || work(th))).collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("a worker thread panicked".into())))
                    .collect()
            });
            results
                .into_iter()
                .collect::<Result<Vec<()>, String>>()
                .map_err(|m| format!("iteration {it}: {m}"))?;
            t.barrier().map_err(e)?;
        }
        let mine = seen.map().range(t.rank());
        let mut counts = vec![0u64; mine.len()];
        seen.get(mine.start, &mut counts).map_err(e)?;
        let mut bad = [counts.iter().filter(|&&c| c != iterations).count() as u64];
        t.allreduce(&mut bad, ReduceOp::Sum).map_err(e)?;
        t.barrier().map_err(e)?;
        seen.free().map_err(e)?;
        q.free().map_err(e)?;
        if let Some((i, c)) = counts.iter().enumerate().find(|(_, &c)| c != iterations) {
            return Err(format!(
                "rank {}: chunk {i} was handed out {c} times in {iterations} iterations",
                t.rank()
            ));
        }
        if bad[0] > 0 {
            return Err(format!(
                "{} chunks elsewhere were not handed out exactly once per iteration",
                bad[0]
            ));
        }
        Ok(Report { stolen: stolen.into_inner(), own: own.into_inner() })
    }
}

pub mod clocks {
    //! The clocks' aggregated words under concurrency (`peregrine_core::clocks`): the combining
    //! trees say "every rank's chunks of `t` are done" and "every clock is at least `c`" exactly
    //! when reading every rank's word would, never before, iteration after iteration.
    //!
    //! Lining up (BSP): each rank announces a different number of chunks (none for some), and
    //! `threads` threads of every rank count chunks of every rank done, racing for each rank's
    //! last one (whose add arrives at the done tree); a rank that sees the iteration done checks
    //! every progress word. Then under SSP(2) the ranks tick as fast as the bound lets them, a
    //! rank now and then held back, and every "reached" is checked against every clock. Last,
    //! the tree of sums (`peregrine_core::sums`, LB-BSP's split at scale): every rank adds its
    //! values to a round at once, and after a barrier each reads the world's totals and the sums
    //! before it, checked against the values every rank added.

    use peregrine_core::clocks::{wait_until, Clocks, Reads};
    use peregrine_core::sums::{Sums, Totals, PARTS};
    use peregrine_transport::Transport;

    /// What one rank saw.
    #[derive(Debug, Default)]
    pub struct Report {
        /// Iterations lined up.
        pub lined_up: u64,
        /// Clocks ticked under SSP(2).
        pub ticked: u64,
        /// Rounds of the tree of sums checked.
        pub summed: u64,
    }

    /// Runs the check on this rank (collective). `Err` says what went wrong.
    pub fn agree(t: &Transport, iterations: u64, threads: usize) -> Result<Report, String> {
        let e = |e: peregrine_transport::Error| e.to_string();
        let (n, me) = (t.world_size(), t.rank());
        let chunks = |r: usize, it: u64| ((r as u64 * 7 + it * 3) % 5) as u32;
        let bsp =
            Clocks::new(t, Reads { staleness: Some(0), lines_up: true, version: true }, 0).map_err(e)?;
        for it in 0..iterations {
            bsp.start(it, chunks(me, it)).map_err(e)?;
            t.barrier().map_err(e)?;
            // Chunk k of rank r is counted by thread k % threads of rank (r + k) % n.
            std::thread::scope(|s| -> Result<(), String> {
                let hs: Vec<_> = (0..threads)
                    .map(|th| {
                        let bsp = &bsp;
                        s.spawn(move || -> Result<(), String> {
                            for r in 0..n {
                                for k in 0..chunks(r, it) as usize {
                                    if (r + k) % n == me && k % threads == th {
                                        bsp.done(r, 1, it).map_err(e)?;
                                    }
                                }
                            }
                            Ok(())
                        })
                    })
                    .collect();
                hs.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            })?;
            wait_until(|| bsp.all_done(it)).map_err(e)?;
            if let Some(r) = bsp.first_not_done(it).map_err(e)? {
                return Err(format!("rank {me}: iteration {it} said done before rank {r}'s chunks were"));
            }
            bsp.tick().map_err(e)?;
            wait_until(|| bsp.reached(it + 1)).map_err(e)?;
            check_clocks(&bsp, it + 1, me)?;
        }
        if bsp.version().map_err(e)? < iterations * n as u64 {
            return Err(format!(
                "rank {me}: version {} after {iterations} iterations",
                bsp.version().map_err(e)?
            ));
        }
        t.barrier().map_err(e)?;
        bsp.free().map_err(e)?;
        let s = 2;
        let ssp =
            Clocks::new(t, Reads { staleness: Some(s), lines_up: false, version: false }, 0).map_err(e)?;
        for it in 0..iterations {
            ssp.tick().map_err(e)?;
            let need = (it + 1).saturating_sub(s);
            wait_until(|| ssp.reached(need)).map_err(e)?;
            check_clocks(&ssp, need, me)?;
            if (me as u64 + it).is_multiple_of(4) {
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        }
        wait_until(|| ssp.reached(iterations)).map_err(e)?;
        if ssp.reached(iterations + 1).map_err(e)? {
            return Err(format!("rank {me}: every clock said past {iterations} after {iterations} ticks"));
        }
        t.barrier().map_err(e)?;
        ssp.free().map_err(e)?;
        sums(t, iterations)?;
        Ok(Report { lined_up: iterations, ticked: iterations, summed: iterations })
    }

    /// The tree of sums, `rounds` rounds (collective): rank `r`'s values in round `j` are a
    /// function of both (no first value for every fifth), so every rank knows what to expect.
    fn sums(t: &Transport, rounds: u64) -> Result<(), String> {
        let e = |e: peregrine_transport::Error| e.to_string();
        let (n, me) = (t.world_size(), t.rank());
        let values = |r: usize, j: u64| -> [u64; PARTS] {
            let first =
                if (r as u64 + j).is_multiple_of(5) { 0 } else { 1 + (r as u64 * 131 + j * 17) % 999 };
            [first, (r as u64 + 2 * j) % 3, r as u64 * 10_007 + j]
        };
        let sums = Sums::new(t, "sums").map_err(e)?;
        for j in 0..rounds {
            sums.add(me, j as usize, values(me, j)).map_err(e)?;
            t.barrier().map_err(e)?;
            let world = Totals::of_all((0..n).map(|r| values(r, j)));
            let before = Totals::of_all((0..me).map(|r| values(r, j)));
            let got = (sums.totals(j as usize).map_err(e)?, sums.before(me, j as usize).map_err(e)?);
            if got != (world, (before, values(me, j))) {
                return Err(format!("rank {me}, round {j}: the tree said {got:?}, the ranks added {world:?} and {before:?} before"));
            }
            // Every rank has read round j before anyone adds to its words again (round j + 2).
            t.barrier().map_err(e)?;
        }
        sums.free().map_err(e)
    }

    /// Every clock is at least `need`, as `reached` said.
    fn check_clocks(c: &Clocks, need: u64, me: usize) -> Result<(), String> {
        let words = c.clock_words().map_err(|e| e.to_string())?;
        match words.iter().position(|&w| w & !peregrine_core::clocks::PASSING < need) {
            Some(r) => {
                Err(format!("rank {me}: every clock said at least {need}, rank {r}'s is {}", words[r]))
            }
            None => Ok(()),
        }
    }
}
