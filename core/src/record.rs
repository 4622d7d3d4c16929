//! What one rank records of an iteration ([`IterRecord`]) and of its whole run
//! ([`RankTotals`]): the engine writes them, and schemes read them (a policy's `end` hook sees
//! the iteration's record; LB-BSP and the straggler report read the totals). A leaf: it imports
//! nothing of the crate, so the engine and the schemes both build on it.

use serde::Serialize;

/// One iteration of one rank, as written to its metrics file.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IterRecord {
    /// The rank.
    pub rank: usize,
    /// The iteration.
    pub iter: u64,
    /// Training seconds (evaluations excluded) at the iteration's start.
    pub start: f64,
    /// Seconds computing (own chunks and chunks taken over).
    pub compute: f64,
    /// Seconds its threads spent in chunks (compute and injected delay), per active thread.
    pub busy: f64,
    /// Seconds pulling and pushing parameters.
    pub comm: f64,
    /// Seconds waiting for other ranks.
    pub wait: f64,
    /// Own chunks computed.
    pub own: u64,
    /// Chunks taken over from other ranks and computed.
    pub taken: u64,
    /// Active compute threads.
    pub threads: usize,
    /// Rows computed.
    pub rows: u64,
    /// Mean loss of the rows computed (before their update).
    pub loss: f64,
    /// Injected delay factor: after each chunk the rank slept this many times its compute time.
    pub delay: f64,
    /// Whether an injected disruptor was burning the rank's cores at the iteration's end.
    pub disrupted: bool,
    /// FlexRR: chunks taken over by rapid reassignment, before this rank's own were done.
    pub reassigned: u64,
    /// Speculative execution: chunks of late ranks this rank computed a copy of and applied
    /// (its copy finished first).
    pub cloned: u64,
    /// Speculative execution: copies this rank computed (own chunks or clones) that finished
    /// second and were dropped.
    pub discarded: u64,
    /// Own chunks this rank was given for the iteration (its split; LB-BSP sizes it).
    pub chunks: u64,
    /// The rank this rank waited for last in the iteration (the slowest it saw), if it waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_for: Option<usize>,
    /// Chunks taken over from each rank: `[victim, chunks]` pairs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taken_from: Vec<(usize, u64)>,
    /// The scheme's own figures of the iteration, written by its policy and flattened into the
    /// line (each scheme file documents its own: DynSGD's `staleness`, backup workers' `backups`
    /// and `dropped`, LB-BSP's `speed` and `predicted`, ...).
    #[serde(flatten)]
    pub scheme: SchemeFigures,
}

/// A scheme's own figures of one iteration, by name, in the order first set. Serialized as the
/// entries of a map (flattened into the record's JSON line); a scheme that sets none adds
/// nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchemeFigures(Vec<(&'static str, Figure)>);

/// One figure of a scheme: a count, a value or a flag (written as a JSON number or boolean).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Figure {
    /// A count (iterations, ranks, chunks).
    Count(u64),
    /// A measured or predicted value.
    Value(f64),
    /// Whether something happened.
    Flag(bool),
}

impl SchemeFigures {
    /// Sets figure `name` (replacing an earlier value of the iteration).
    pub fn set(&mut self, name: &'static str, figure: Figure) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = figure,
            None => self.0.push((name, figure)),
        }
    }

    /// Figure `name`, if the scheme set it.
    pub fn get(&self, name: &str) -> Option<Figure> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
    }

    /// Count `name`, 0 if unset (or not a count).
    pub fn count(&self, name: &str) -> u64 {
        match self.get(name) {
            Some(Figure::Count(c)) => c,
            _ => 0,
        }
    }
}

impl Serialize for SchemeFigures {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (name, figure) in &self.0 {
            match *figure {
                Figure::Count(c) => m.serialize_entry(name, &c)?,
                Figure::Value(v) => m.serialize_entry(name, &v)?,
                Figure::Flag(b) => m.serialize_entry(name, &b)?,
            }
        }
        m.end()
    }
}

impl IterRecord {
    /// Adds this iteration to `totals`.
    pub(crate) fn add_to(&self, totals: &mut RankTotals) {
        totals.compute += self.compute;
        totals.comm += self.comm;
        totals.wait += self.wait;
        totals.own += self.own;
        totals.taken += self.taken;
        totals.rows += self.rows;
        totals.cloned += self.cloned;
        totals.discarded += self.discarded;
        totals.assigned += self.chunks;
        totals.busy += self.busy;
    }
}

/// Totals of one rank.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct RankTotals {
    /// Seconds computing.
    pub compute: f64,
    /// Seconds pulling and pushing.
    pub comm: f64,
    /// Seconds waiting.
    pub wait: f64,
    /// Seconds its threads spent in chunks, per active thread (the compute rate's time).
    pub busy: f64,
    /// Own chunks computed.
    pub own: u64,
    /// Chunks taken over and computed.
    pub taken: u64,
    /// Rows computed (and applied).
    pub rows: u64,
    /// Speculative execution: copies of late ranks' chunks computed and applied.
    pub cloned: u64,
    /// Speculative execution: copies computed and dropped (they finished second).
    pub discarded: u64,
    /// LB-BSP: the sum over iterations of `|predicted - measured| / measured` speed, and the
    /// number of iterations summed.
    pub prediction_error: f64,
    /// LB-BSP: see `prediction_error`.
    pub predictions: u64,
    /// Own chunks it was given (its splits summed).
    pub assigned: u64,
    /// Seconds other ranks waited for it (each wait counted for the rank last waited for).
    pub waited_for_me: f64,
    /// The 90th percentile of its iteration rates (rows per second of compute).
    pub best_rate: f64,
    /// The median of its iteration rates.
    pub median_rate: f64,
    /// Share of its iterations under the straggler threshold of its own best rate (see
    /// `crate::straggler`).
    pub slow_share: f64,
    /// Runs of those slow iterations.
    pub episodes: u64,
    /// Whether the runs start at whole multiples of one period.
    pub periodic: bool,
}

/// Numbers in [`RankTotals`], as summed over ranks.
pub(crate) const TOTALS: usize = 18;

impl RankTotals {
    pub(crate) fn to_array(self) -> [f64; TOTALS] {
        [
            self.compute,
            self.comm,
            self.wait,
            self.own as f64,
            self.taken as f64,
            self.rows as f64,
            self.cloned as f64,
            self.discarded as f64,
            self.prediction_error,
            self.predictions as f64,
            self.assigned as f64,
            self.waited_for_me,
            self.best_rate,
            self.median_rate,
            self.slow_share,
            self.episodes as f64,
            f64::from(u8::from(self.periodic)),
            self.busy,
        ]
    }

    pub(crate) fn from_array(a: &[f64]) -> Self {
        Self {
            compute: a[0],
            comm: a[1],
            wait: a[2],
            own: a[3] as u64,
            taken: a[4] as u64,
            rows: a[5] as u64,
            cloned: a[6] as u64,
            discarded: a[7] as u64,
            prediction_error: a[8],
            predictions: a[9] as u64,
            assigned: a[10] as u64,
            waited_for_me: a[11],
            best_rate: a[12],
            median_rate: a[13],
            slow_share: a[14],
            episodes: a[15] as u64,
            periodic: a[16] != 0.0,
            busy: a[17],
        }
    }
}
