//! BSP, SSP(s) and ASP: how far ahead of the slowest rank a rank may run. A rank that has
//! pushed iteration `t` starts `t + 1` once the slowest clock is at least `t + 1` (BSP),
//! `t + 1 - s` (SSP(s)), or at once (ASP). Under BSP with taking over, ranks also line up after
//! computing: nobody pushes `t` before every chunk of `t` is done, so a rank taking over chunks
//! reads `t`'s parameters, as their owner would have.
//!
//! The [`Bound`] rule is shared by the schemes built over BSP or SSP (DynSGD, LB-BSP, FlexRR,
//! speculative execution, Falcon).

use std::fmt;
use std::sync::Arc;

use super::{arg, bound, Family, Parsed, Policy, Result, SchemeKind, Setup, View};

pub(crate) const FAMILY: Family = Family {
    forms: "bsp, asp, ssp[:<staleness>]",
    names: &["bsp", "ssp", "asp"],
    compared: &["bsp", "bsp+steal", "ssp:3+steal"],
    parse,
};

/// SSP's staleness bound when none is given (`ssp` is `ssp:3`).
pub(crate) const DEFAULT_SSP_BOUND: u64 = 3;

fn parse(s: &str) -> Option<Parsed> {
    let b = match s {
        "bsp" => Ok(Bound::Bsp),
        "asp" => Ok(Bound::Asp),
        "ssp" => Ok(Bound::Ssp(DEFAULT_SSP_BOUND)),
        _ => bound(s, arg(s, "ssp")?, "ssp:3").map(Bound::Ssp),
    };
    Some(b.map(|b| Arc::new(b) as Arc<dyn SchemeKind>))
}

/// How far ahead of the slowest clock a rank may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Every update of `t` applied before anyone reads for `t + 1`.
    Bsp,
    /// At most `s` iterations ahead of the slowest.
    Ssp(u64),
    /// Never wait.
    Asp,
}

impl Bound {
    /// The clock the slowest rank must reach before a rank that pushed `it` starts `it + 1`
    /// (`None`: no wait).
    pub(crate) fn needs(self, it: u64) -> Option<u64> {
        match self {
            Self::Bsp => Some(it + 1),
            Self::Ssp(s) => (it + 1).checked_sub(s),
            Self::Asp => None,
        }
    }

    /// Whether a rank that pushed `it` may start `it + 1`.
    pub(crate) fn ready(self, view: &dyn View, it: u64) -> Result<bool> {
        match self.needs(it) {
            Some(need) => view.reached(need),
            None => Ok(true),
        }
    }

    /// The most iterations a rank runs ahead of the slowest clock ([`Policy::staleness`]).
    pub(crate) fn staleness(self) -> Option<u64> {
        match self {
            Self::Bsp => Some(0),
            Self::Ssp(s) => Some(s),
            Self::Asp => None,
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bsp => f.write_str("bsp"),
            Self::Ssp(s) => write!(f, "ssp:{s}"),
            Self::Asp => f.write_str("asp"),
        }
    }
}

impl SchemeKind for Bound {
    fn pulls_every_update(&self) -> bool {
        *self == Bound::Bsp
    }

    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        Ok(Box::new(Staleness { bound: *self, steal: setup.steal }))
    }
}

/// The policy: wait as the bound says; take over chunks if asked.
struct Staleness {
    bound: Bound,
    steal: bool,
}

impl Policy for Staleness {
    fn takes_over(&self) -> bool {
        self.steal
    }

    fn line_up(&self) -> bool {
        self.bound == Bound::Bsp && self.steal
    }

    fn leaves_chunks(&self) -> bool {
        self.line_up()
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        self.bound.ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        self.bound.staleness()
    }

    fn synchronous(&self) -> bool {
        self.bound == Bound::Bsp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Snapshot;

    #[test]
    fn each_bound_waits_for_the_slowest_clock_it_names() {
        // Four ranks; this one has pushed iteration 9 (clock 10); the slowest is at clock 7.
        let mut v = Snapshot::new(0, 4);
        v.clocks = vec![10, 9, 7, 8];
        // BSP: the slowest must reach 10. SSP(2): 10 - 2 = 8. SSP(3): 7. ASP: none.
        assert_eq!(Bound::Bsp.needs(9), Some(10));
        assert_eq!(Bound::Ssp(2).needs(9), Some(8));
        assert!(!Bound::Bsp.ready(&v, 9).expect("view"));
        assert!(!Bound::Ssp(2).ready(&v, 9).expect("view"));
        assert!(Bound::Ssp(3).ready(&v, 9).expect("view"));
        assert!(Bound::Asp.ready(&v, 9).expect("view"));
        // Early on, a bound larger than the iteration asks for nothing.
        assert_eq!(Bound::Ssp(5).needs(2), None);
        v.clocks = vec![10, 10, 10, 10];
        assert!(Bound::Bsp.ready(&v, 9).expect("view"));
        // SSP(0) waits as BSP does.
        assert_eq!(Bound::Ssp(0).needs(9), Bound::Bsp.needs(9));
        // What the engine's clock tree is sized by.
        assert_eq!([Bound::Bsp, Bound::Ssp(3), Bound::Asp].map(Bound::staleness), [Some(0), Some(3), None]);
    }

    #[test]
    fn only_bsp_is_synchronous() {
        // SSP(0) waits as BSP does, but the claim that every update of an iteration has landed
        // is BSP's alone.
        for (bound, sync) in
            [(Bound::Bsp, true), (Bound::Ssp(0), false), (Bound::Ssp(3), false), (Bound::Asp, false)]
        {
            for steal in [false, true] {
                assert_eq!(Staleness { bound, steal }.synchronous(), sync, "{bound} steal {steal}");
            }
        }
    }

    #[test]
    fn only_bsp_with_taking_over_lines_up() {
        for (bound, steal, lines_up) in [
            (Bound::Bsp, true, true),
            (Bound::Bsp, false, false),
            (Bound::Ssp(0), true, false),
            (Bound::Asp, true, false),
        ] {
            let p = Staleness { bound, steal };
            assert_eq!(p.line_up(), lines_up, "{bound} steal {steal}");
            // The end game, and the rates it reads, where the iteration ends with its last chunk.
            assert_eq!((p.leaves_chunks(), p.reads_rates()), (lines_up, lines_up), "{bound} steal {steal}");
        }
    }
}
