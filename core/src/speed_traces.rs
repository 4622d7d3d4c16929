//! Speed traces with and without structure: each trace is one rank's speed per iteration with
//! the CPU and memory load seen during it, generated from a seed. Injected stragglers follow them
//! (`trace:name=...`, [`crate::inject`]) and LB-BSP's predictors are compared on them offline
//! ([`crate::scheme::traces`]). A leaf: nothing of the crate but the plan's hash.
//!
//! - `noise`: a steady speed with +-10 % i.i.d. noise (nothing to learn: the mean is the best
//!   prediction);
//! - `periodic`: a disruptor that slows the rank to half speed for 6 iterations out of every 20
//!   (5 % noise); the CPU load shows when it burns;
//! - `trend`: a slowdown from full to 40 % speed over 50 iterations, then back (a sawtooth, as a
//!   leak that a restart clears; 3 % noise);
//! - `load`: the speed a nonlinear function of a CPU load that wanders (no effect below 60 %
//!   load, then a steep fall), 3 % noise;
//! - `mix`: the four behaviours in turn, 150 iterations each (a predictor must follow a change
//!   of regime).

/// One rank's speeds and loads per iteration.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Short name (`noise`, `periodic`, ...).
    pub name: &'static str,
    /// Speed per iteration.
    pub speeds: Vec<f64>,
    /// CPU load per iteration (0..1 and above).
    pub cpu: Vec<f64>,
    /// Memory load per iteration (0..1).
    pub mem: Vec<f64>,
}

/// The trace names, in order.
pub const NAMES: [&str; 5] = ["noise", "periodic", "trend", "load", "mix"];

/// A uniform number in `[0, 1)` from `(seed, stream, i)`.
fn unit(seed: u64, stream: u64, i: u64) -> f64 {
    let h = crate::plan::mix(seed ^ crate::plan::mix(stream ^ crate::plan::mix(i)));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Speed and CPU load of iteration `i` of trace `name` (one of [`NAMES`]; other names: `mix`).
pub fn speed(name: &str, seed: u64, i: u64) -> (f64, f64) {
    let noise = |amp: f64| 1.0 + amp * (unit(seed, 1, i) - 0.5) * 2.0;
    let jitter = 0.02 * (unit(seed, 2, i) - 0.5);
    match name {
        "noise" => (1000.0 * noise(0.1), 0.5 + jitter),
        "periodic" => {
            let burning = i % 20 < 6;
            (if burning { 500.0 } else { 1000.0 } * noise(0.05), if burning { 0.9 } else { 0.4 } + jitter)
        }
        "trend" => (1000.0 * (1.0 - 0.6 * (i % 50) as f64 / 50.0) * noise(0.03), 0.5 + jitter),
        "load" => {
            // A load wandering between 0.2 and 1.0: a sum of two slow waves with random phases.
            let phase = 6.3 * unit(seed, 3, 0);
            let t = i as f64;
            let cpu = 0.6 + 0.25 * (t / 9.0 + phase).sin() + 0.15 * (t / 4.0 + 2.0 * phase).sin();
            let slow = 1.0 + 6.0 * (cpu - 0.6).max(0.0);
            (1000.0 / slow * noise(0.03), cpu + jitter)
        }
        _ => {
            let regime = NAMES[(i / 150 % 4) as usize];
            speed(regime, seed, i)
        }
    }
}

/// Trace `name` (one of [`NAMES`]) of `len` iterations.
///
/// # Panics
/// If `name` is not one of [`NAMES`].
pub fn trace(name: &str, len: usize, seed: u64) -> Trace {
    let name = *NAMES.iter().find(|n| **n == name).expect("a trace name");
    let (speeds, cpu) = (0..len as u64).map(|i| speed(name, seed, i)).unzip();
    Trace { name, speeds, cpu, mem: vec![0.3; len] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_have_their_structure() {
        let p = trace("periodic", 40, 1);
        assert!(p.speeds[3] < 600.0 && p.speeds[10] > 900.0 && p.speeds[23] < 600.0);
        assert!(p.cpu[3] > 0.8 && p.cpu[10] < 0.5);
        let t = trace("trend", 100, 1);
        assert!(t.speeds[49] < 450.0 && t.speeds[50] > 950.0);
        let m = trace("mix", 600, 1);
        assert_eq!(m.speeds[160], trace("periodic", 600, 1).speeds[160]);
        assert_eq!(trace("noise", 50, 4).speeds, trace("noise", 50, 4).speeds, "deterministic");
    }
}
