//! LB-BSP's speed predictors ([`super::lbbsp::Predictor`]) compared offline on the speed traces
//! of [`crate::speed_traces`] (with and without structure).

pub use crate::speed_traces::{speed, trace, Trace, NAMES};

use super::lbbsp::{History, Predictor};

/// Mean relative error `|predicted - speed| / speed` of `predictor` on `trace`, the first `skip`
/// iterations not counted (warm-up).
pub fn error(predictor: Predictor, trace: &Trace, skip: usize) -> f64 {
    let mut h = History::new(predictor);
    let (mut sum, mut n) = (0.0, 0);
    let mut predicted: Option<f64> = None;
    for (i, &s) in trace.speeds.iter().enumerate() {
        if let (Some(p), true) = (predicted, i >= skip) {
            sum += (p - s).abs() / s;
            n += 1;
        }
        predicted = Some(h.observe(s, trace.cpu[i], trace.mem[i]));
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NARX's sizes and rates were chosen on seeds 1 and 5; judged here on others.
    #[test]
    fn narx_beats_arx_and_the_average_where_there_is_structure_and_keeps_up_on_noise() {
        for seed in [2, 3, 4] {
            for name in NAMES {
                let t = trace(name, 600, seed);
                let [arx, ma, narx] = Predictor::ALL.map(|p| error(p, &t, 30));
                let msg = format!("seed {seed} {name}: narx {narx} arx {arx} ma {ma}");
                match name {
                    "noise" => assert!(narx <= 1.05 * arx.min(ma), "{msg}"),
                    // A load that moves slowly: ARX's linear term in it does as well (measured
                    // within +-6 % of NARX either way over seeds); both far ahead of the average.
                    "load" => assert!(narx < 1.1 * arx && narx < 0.5 * ma, "{msg}"),
                    _ => assert!(narx < arx.min(ma), "{msg}"),
                }
            }
        }
    }
}
