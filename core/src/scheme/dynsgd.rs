//! DynSGD (Jiang et al., SIGMOD 2017): SSP(s) (ASP without a bound) with every update scaled by
//! `1 / (1 + staleness)`, staleness being the number of model versions between this rank's pull
//! and its push, a version being `N` updates (one per rank, what one BSP step applies): with no
//! straggler an update is at most a round old and applies in full; a straggler's updates,
//! computed while the others pushed several rounds, are damped. (Counting single updates halved
//! every update on two ranks and made DynSGD 2.1x Ideal with no straggler.)

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::staleness::Bound;
use super::{arg, bound, Admit, Family, Parsed, Policy, Result, SchemeKind, Setup, View};
use crate::record::{Figure, IterRecord};

pub(crate) const FAMILY: Family =
    Family { forms: "dynsgd[:<staleness>]", names: &["dynsgd"], compared: &[], parse };

fn parse(s: &str) -> Option<Parsed> {
    let d = match s {
        "dynsgd" => Ok(DynSgd { bound: None }),
        _ => bound(s, arg(s, "dynsgd")?, "dynsgd:2").map(|b| DynSgd { bound: Some(b) }),
    };
    Some(d.map(|d| Arc::new(d) as Arc<dyn SchemeKind>))
}

/// DynSGD's staleness bound (`None`: asynchronous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DynSgd {
    bound: Option<u64>,
}

impl fmt::Display for DynSgd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bound {
            None => f.write_str("dynsgd"),
            Some(s) => write!(f, "dynsgd:{s}"),
        }
    }
}

impl SchemeKind for DynSgd {
    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        let bound = self.bound.map_or(Bound::Asp, Bound::Ssp);
        Ok(Box::new(Damped { bound, steal: setup.steal, pulled: 0 }))
    }
}

/// The policy: the version at the pull, compared with the version at the push.
struct Damped {
    bound: Bound,
    steal: bool,
    /// The parameters' version (all clocks summed) when this rank pulled.
    pulled: u64,
}

/// Versions the model moved on between `pulled` and `now` (updates counted by clocks) in a world
/// of `world` ranks, and the factor that damps an update that stale.
pub(crate) fn damping(pulled: u64, now: u64, world: usize) -> (u64, f32) {
    let staleness = now.saturating_sub(pulled) / world as u64;
    (staleness, 1.0 / (1 + staleness) as f32)
}

impl Policy for Damped {
    fn takes_over(&self) -> bool {
        self.steal
    }

    fn open(&mut self, view: &dyn View, _it: u64) -> Result<()> {
        self.pulled = view.version()?;
        Ok(())
    }

    fn admit(
        &mut self,
        view: &dyn View,
        _it: u64,
        _compute: Duration,
        rec: &mut IterRecord,
    ) -> Result<Admit> {
        let (staleness, scale) = damping(self.pulled, view.version()?, view.world());
        rec.scheme.set("staleness", Figure::Count(staleness));
        Ok(Admit { apply: true, scale })
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        self.bound.ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        self.bound.staleness()
    }

    fn reads_version(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;

    #[test]
    fn updates_are_damped_by_whole_versions() {
        // 4 ranks: 3 updates pushed since the pull are less than one version: applied in full.
        assert_eq!(damping(100, 103, 4), (0, 1.0));
        // 8 updates are two versions: a third of the step.
        assert_eq!(damping(100, 108, 4), (2, 1.0 / 3.0));
        // 11 updates: still two whole versions.
        assert_eq!(damping(100, 111, 4).0, 2);
    }

    #[test]
    fn the_policy_compares_the_versions_at_pull_and_push() {
        let mut p = Damped { bound: Bound::Asp, steal: true, pulled: 0 };
        let mut v = Snapshot::new(1, 2);
        v.clocks = vec![5, 3];
        p.open(&v, 3).expect("view");
        assert_eq!(p.pulled, 8);
        // Rank 0 pushed 4 more (2 versions of 2 updates) before rank 1's push.
        v.clocks = vec![9, 3];
        let mut rec = IterRecord::default();
        let a = p.admit(&v, 3, Duration::ZERO, &mut rec).expect("view");
        assert_eq!((rec.scheme.count("staleness"), a), (2, Admit { apply: true, scale: 1.0 / 3.0 }));
    }
}
