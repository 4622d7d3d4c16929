//! Dispatch overhead of a rank's compute pool (`RankPool::run` with empty jobs): back to back, and
//! with the caller busy between runs as in an iteration loop, pinned and not, with and without the
//! spin before parking. A measurement, printed: `cargo bench -p peregrine-benches --bench pool`.
//! (The pool documents why it is not rayon: `broadcast` cost 15-16 us per dispatch here.)

use std::time::{Duration, Instant};

use peregrine_core::pool::{Pinning, RankPool, Slot, DEFAULT_SPIN};

fn busy(us: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

fn main() {
    let empty = |w: usize| {
        std::hint::black_box(w);
    };
    for (pinning, spin) in
        [(Pinning::Auto, DEFAULT_SPIN), (Pinning::Off, DEFAULT_SPIN), (Pinning::Auto, Duration::ZERO)]
    {
        let pool = match RankPool::new(2, Slot::WHOLE, pinning) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: pool: {e}");
                std::process::exit(1);
            }
        };
        pool.set_spin(spin);
        println!("{pinning:?}, spin {spin:?}, {}", pool.placement().how);
        for active in [1, 2] {
            pool.set_active(active);
            let mut line = format!("  max 2, active {active}, us per run (median/p90): back to back");
            for gap_us in [0, 20, 200, 1000] {
                let runs: u32 = if gap_us == 0 { 10_000 } else { 1000 };
                for _ in 0..100 {
                    pool.run(empty);
                }
                let mut times: Vec<Duration> = (0..runs)
                    .map(|_| {
                        busy(gap_us);
                        let t = Instant::now();
                        pool.run(empty);
                        t.elapsed()
                    })
                    .collect();
                times.sort_unstable();
                let us = |q: f64| times[(q * f64::from(runs - 1)) as usize].as_secs_f64() * 1e6;
                if gap_us > 0 {
                    line += &format!(", {gap_us} us between");
                }
                line += &format!(" {:.1}/{:.1}", us(0.5), us(0.9));
            }
            println!("{line}");
        }
    }
}
