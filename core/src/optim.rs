//! Optimizers whose state lives in the parameter window beside the weights, and learning-rate
//! schedules.
//!
//! A rank's push carries its **contribution** `c = s g` to the iteration's update, where `g` is
//! the mean gradient over the rows it computed and `s` its **share** of the iteration (its rows
//! over the batch's rows, times what the scheme admits: backup workers scale the in-time updates
//! up, DynSGD damps stale ones). Under BSP the shares of an iteration sum to one and the
//! contributions to the batch's mean gradient. Every rule below is written so that pushes that
//! read the same state **add up** to one step of the textbook rule on the batch's gradient (up
//! to the squares: AdaGrad's and Adam's second moments get the mean of the ranks' squared
//! gradients, `sum s g_r^2`, rather than the square of their mean); one rank with share 1 is the
//! textbook rule exactly. A push computes the weight update and the state update and
//! `accumulate`s both into the owning shards like any other update, so stale, dropped and damped
//! updates need nothing special: a dropped update changes neither weights nor state; a stale one
//! was computed from older weights and meets the state as it was read.
//!
//! Which state a push steps with: a model pulled whole (dense models, and sparse ones small
//! enough to be pulled whole) reads its state with its weights, before the iteration's pushes,
//! so under BSP an iteration's pushes add up to one step whatever order they land in. A sparse
//! model pulled by key reads the state of the keys it pushes when it pushes (its threads pull the
//! keys of chunks they take over on their own), so a push meets the state left by the pushes
//! that landed before it, as a server applying pushes in arrival order would.
//!
//! Per parameter, with learning rate `a`, contribution `c`, share `s`, `g = c / s`:
//! - **SGD**: `w += -a c`; no state.
//! - **Momentum** `mu` (heavy ball, PyTorch's form `v <- mu v + g`, `w <- w - a v`):
//!   `v += s (mu - 1) v + c`, `w += -a (s mu v + c)`; **Nesterov** `w <- w - a (g + mu v')`:
//!   `w += -a (s mu^2 v + (1 + mu) c)`.
//! - **AdaGrad** (`G <- G + g^2`, `w <- w - a g / (sqrt(G) + eps)`): `G += c g`,
//!   `w += -a c / (sqrt(G + g^2) + eps)`.
//! - **Adam** (bias-corrected, step `t` the iteration): `m += (1 - b1)(c - s m)`,
//!   `v += (1 - b2)(c g - s v)`, `w += -a s m' / (1 - b1^t) / (sqrt(v' / (1 - b2^t)) + eps)` with
//!   `m' = m + (1 - b1)(g - m)`, `v' = v + (1 - b2)(g^2 - v)` (this push's view of the moments).
//! - **FTRL-Proximal** (McMahan et al., 2013) with L1 weight `l1`: the window holds `z` where the
//!   others hold `w`, and `n` as state; a weight is *derived* on every read,
//!   `w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / a)`, so weights inside
//!   the L1 ball are exact zeros however updates interleave (a proximal step applied by each
//!   writer to a value others change meanwhile would not keep them). Update:
//!   `sigma = (sqrt(n + g^2) - sqrt(n)) / a`, `z += c - s sigma w`, `n += c g`. Both are sums, so
//!   they accumulate one-sidedly. Parameters exempt from L1 (an intercept) use `l1 = 0`.
//!
//! Sparse models touch only the keys their rows read: state of other keys neither decays nor
//! moves (the "lazy" form of momentum and Adam that sparse parameter servers use).

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// An update rule ([module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Optimizer {
    /// Plain SGD.
    #[default]
    Sgd,
    /// Heavy-ball momentum, or Nesterov's.
    Momentum {
        /// Momentum coefficient, in `[0, 1)`.
        mu: f32,
        /// Nesterov's look-ahead form.
        nesterov: bool,
    },
    /// AdaGrad: per-parameter rates from the summed squared gradients.
    AdaGrad {
        /// Added to the denominator.
        eps: f32,
    },
    /// Adam.
    Adam {
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the denominator.
        eps: f32,
    },
    /// FTRL-Proximal with L1 (weights derived from the window's `z` and `n`).
    Ftrl {
        /// The per-coordinate rate's smoothing: rate `a / (beta + sqrt(n))`.
        beta: f32,
        /// L1 weight: `l1 |w|` added to the loss (not of exempt parameters).
        l1: f32,
    },
}

/// Momentum coefficient when none is given.
pub const MOMENTUM: f32 = 0.9;
/// AdaGrad's and Adam's epsilon.
pub const EPS: f32 = 1e-8;
/// Adam's moment decays.
pub const ADAM_BETAS: (f32, f32) = (0.9, 0.999);
/// FTRL's `beta` (McMahan et al.'s recommended 1).
pub const FTRL_BETA: f32 = 1.0;

/// The gradient of an owner-side step ([`Optimizer::step_in_place`]) as its parts lie:
/// `scale (parts[0] + parts[1] + ... + own) + l2 w` on the decayed ranges.
#[derive(Clone, Copy, Debug)]
pub struct Gradient<'a> {
    /// The other ranks' contributions, each as long as the weights, back to back.
    pub parts: &'a [f32],
    /// The owner's own contribution, added last.
    pub own: Option<&'a [f32]>,
    /// The factor on the sum: `1 / rows` of contributions pushed as sums over rows, 1 for
    /// contributions already scaled.
    pub scale: f32,
    /// An L2 penalty's weight and the ranges of the weights it applies to (its gradient
    /// `l2 w`, PyTorch's `weight_decay`), applied here instead of by the chunks.
    pub decay: Option<(f32, &'a [Range<usize>])>,
}

/// What one push's step needs besides the data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// Learning rate (after the schedule).
    pub lr: f32,
    /// The push's share of the iteration (positive).
    pub share: f32,
    /// The step number, from 1 (Adam's bias correction).
    pub t: u64,
}

impl Optimizer {
    /// State values per parameter.
    pub fn slots(&self) -> usize {
        match self {
            Self::Sgd => 0,
            Self::Momentum { .. } | Self::AdaGrad { .. } | Self::Ftrl { .. } => 1,
            Self::Adam { .. } => 2,
        }
    }

    /// Whether the window holds something else than the weights, from which they are derived on
    /// every read ([`weights`](Self::weights)).
    pub fn derived(&self) -> bool {
        matches!(self, Self::Ftrl { .. })
    }

    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd => "sgd",
            Self::Momentum { nesterov: false, .. } => "momentum",
            Self::Momentum { nesterov: true, .. } => "nesterov",
            Self::AdaGrad { .. } => "adagrad",
            Self::Adam { .. } => "adam",
            Self::Ftrl { .. } => "ftrl",
        }
    }

    /// The same optimizer with L1 weight `l1` (FTRL only; others have none).
    #[must_use]
    pub fn with_l1(self, l1: f32) -> Self {
        match self {
            Self::Ftrl { beta, .. } => Self::Ftrl { beta, l1 },
            o => o,
        }
    }

    /// Steps parameters: `c` holds the push's contributions and receives the updates of the
    /// window's values (weights, or FTRL's `z`); `st` is their state as read (`slots()` values
    /// per parameter, interleaved), `ds` receives the state's update; `w` holds FTRL's weights as
    /// read (derived, L1 already applied; empty for other rules).
    pub fn step(&self, p: Step, c: &mut [f32], st: &[f32], ds: &mut [f32], w: &[f32]) {
        let (a, s) = (p.lr, p.share);
        match *self {
            Self::Sgd => c.iter_mut().for_each(|c| *c *= -a),
            Self::Momentum { mu, nesterov } => {
                for ((c, &v), dv) in c.iter_mut().zip(st).zip(ds.iter_mut()) {
                    *dv = s * (mu - 1.0) * v + *c;
                    *c = if nesterov {
                        -a * (s * mu * mu * v + (1.0 + mu) * *c)
                    } else {
                        -a * (s * mu * v + *c)
                    };
                }
            }
            Self::AdaGrad { eps } => {
                for ((c, &acc), dg) in c.iter_mut().zip(st).zip(ds.iter_mut()) {
                    let g = *c / s;
                    *dg = *c * g;
                    *c = -a * *c / ((acc + g * g).sqrt() + eps);
                }
            }
            Self::Adam { beta1, beta2, eps } => {
                let t = p.t.min(i32::MAX as u64) as i32;
                let (k1, k2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
                for ((c, mv), d) in c.iter_mut().zip(st.chunks_exact(2)).zip(ds.chunks_exact_mut(2)) {
                    let (m, v) = (mv[0], mv[1]);
                    let g = *c / s;
                    d[0] = (1.0 - beta1) * (*c - s * m);
                    d[1] = (1.0 - beta2) * (*c * g - s * v);
                    let m1 = m + (1.0 - beta1) * (g - m);
                    let v1 = (v + (1.0 - beta2) * (g * g - v)).max(0.0);
                    *c = -a * s * (m1 / k1) / ((v1 / k2).sqrt() + eps);
                }
            }
            Self::Ftrl { .. } => {
                for (((c, &n), dn), &w) in c.iter_mut().zip(st).zip(ds.iter_mut()).zip(w) {
                    let g = *c / s;
                    let sigma = ((n + g * g).sqrt() - n.sqrt()) / a;
                    *dn = *c * g;
                    *c -= s * sigma * w;
                }
            }
        }
    }

    /// One step of the whole batch (share 1, as [`step`](Self::step) takes it) on parameters in
    /// place: the gradient is [`Gradient`]'s sum (the other ranks' contributions, each as long
    /// as `w`, in their order, then the owner's own), times its scale, plus its decay, and `w`
    /// (the weights) and `st` (their state, `slots()` values per parameter, interleaved) are
    /// stepped; the contributions are only read. The values are [`step`](Self::step)'s on that
    /// gradient followed by adding its updates to `w` and `st`, bit for bit: the sum and `step`
    /// run on blocks small enough to stay in the first-level cache, and each block's updates
    /// are added at once, so the parameters pass through memory once (the owner-side step,
    /// which before read the gradient and the state into buffers, stepped, and accumulated both
    /// back).
    ///
    /// # Panics
    /// If FTRL (its step needs the derived weights), on `p.share != 1`, or if the lengths
    /// disagree or a decayed range is outside `w`.
    pub fn step_in_place(&self, p: Step, w: &mut [f32], st: &mut [f32], g: &Gradient<'_>) {
        /// Parameters per block: with Adam's two slots, 3 KiB of updates.
        const BLOCK: usize = 256;
        let (k, n) = (self.slots(), w.len());
        let Gradient { parts, own, scale, decay } = *g;
        assert!(!self.derived(), "{}: no step in place (its step reads the derived weights)", self.name());
        assert!(p.share == 1.0, "a step in place is the whole batch's (share {})", p.share);
        assert!(
            (n == 0 && parts.is_empty()) || (n > 0 && parts.len().is_multiple_of(n)),
            "step_in_place: the contributions ({}) are not whole multiples of the weights ({n})",
            parts.len()
        );
        assert_eq!(st.len(), n * k, "step_in_place: the state is not {k} values per parameter");
        assert!(k <= 2, "step_in_place: {k} state slots");
        assert!(own.is_none_or(|o| o.len() == n), "step_in_place: own contributions differ in length");
        let decay = decay.unwrap_or((0.0, &[]));
        assert!(decay.1.iter().all(|r| r.end <= n), "step_in_place: a decayed range past the weights");
        if self.fused_step_in_place(p, w, st, g) {
            return;
        }
        let (mut c, mut ds) = ([0.0f32; BLOCK], [0.0f32; BLOCK * 2]);
        for (b, w) in w.chunks_mut(BLOCK).enumerate() {
            let at = b * BLOCK..b * BLOCK + w.len();
            let st = &mut st[at.start * k..at.end * k];
            let (c, ds) = (&mut c[..w.len()], &mut ds[..w.len() * k]);
            c.fill(0.0);
            for part in parts.chunks_exact(n.max(1)) {
                for (c, g) in c.iter_mut().zip(&part[at.clone()]) {
                    *c += *g;
                }
            }
            if let Some(own) = own {
                for (c, o) in c.iter_mut().zip(&own[at.clone()]) {
                    *c += *o;
                }
            }
            if scale != 1.0 {
                c.iter_mut().for_each(|c| *c *= scale);
            }
            let (l2, ranges) = decay;
            for r in ranges {
                let (lo, hi) = (r.start.max(at.start), r.end.min(at.end));
                for j in lo..hi {
                    c[j - at.start] += l2 * w[j - at.start];
                }
            }
            self.step(p, c, st, ds, &[]);
            for (w, c) in w.iter_mut().zip(c.iter()) {
                *w += *c;
            }
            for (s, d) in st.iter_mut().zip(ds.iter()) {
                *s += *d;
            }
        }
    }

    /// [`step_in_place`](Self::step_in_place) for SGD and momentum with one other rank's
    /// contribution and the owner's own (the owner-side step of 2 ranks), and decayed ranges in
    /// order, in one pass over each parameter: the sum, scale, penalty and rule of the blocked
    /// form, in its order, bit for bit (the blocked form passes over each block eight times;
    /// 51k parameters, the MLP's shard on 2 ranks, in cache: 27 -> 13 us). Returns whether it
    /// applied.
    fn fused_step_in_place(&self, p: Step, w: &mut [f32], st: &mut [f32], g: &Gradient<'_>) -> bool {
        let n = w.len();
        let (Gradient { parts, own: Some(own), scale, decay }, Self::Sgd | Self::Momentum { .. }) =
            (*g, self)
        else {
            return false;
        };
        let (l2, ranges) = decay.unwrap_or((0.0, &[]));
        // One other rank's part (2 ranks), or none (1 rank).
        if (parts.len() != n && !parts.is_empty()) || !ranges.windows(2).all(|r| r[0].end <= r[1].start) {
            return false;
        }
        // One stretch of parameters, with the penalty or without it.
        let mut stretch = |lo: usize, hi: usize, decayed: bool| {
            if lo >= hi {
                return;
            }
            let (w, own) = (&mut w[lo..hi], &own[lo..hi]);
            let part = if parts.is_empty() { parts } else { &parts[lo..hi] };
            let m = match *self {
                Self::Momentum { mu, nesterov } => Some((mu, nesterov, &mut st[lo..hi])),
                _ => None,
            };
            macro_rules! parted {
                ($parted:literal) => {
                    match (m, decayed) {
                        (None, false) => sgd_fused::<false, $parted>(p, w, part, own, scale, l2),
                        (None, true) => sgd_fused::<true, $parted>(p, w, part, own, scale, l2),
                        (Some((mu, false, st)), false) => {
                            momentum_fused::<false, false, $parted>(p, mu, w, st, part, own, scale, l2)
                        }
                        (Some((mu, false, st)), true) => {
                            momentum_fused::<true, false, $parted>(p, mu, w, st, part, own, scale, l2)
                        }
                        (Some((mu, true, st)), false) => {
                            momentum_fused::<false, true, $parted>(p, mu, w, st, part, own, scale, l2)
                        }
                        (Some((mu, true, st)), true) => {
                            momentum_fused::<true, true, $parted>(p, mu, w, st, part, own, scale, l2)
                        }
                    }
                };
            }
            if part.is_empty() {
                parted!(false)
            } else {
                parted!(true)
            }
        };
        // In order: before each decayed range, the range, and what follows the last.
        let mut at = 0;
        for r in ranges {
            stretch(at, r.start, false);
            stretch(r.start, r.end, true);
            at = r.end;
        }
        stretch(at, n, false);
        true
    }

    /// FTRL: turns the window's values `zw` (parameters `first..`) into weights in place, given
    /// their state `st` as read. Other optimizers keep weights in the window: nothing to do.
    pub fn weights(&self, lr: f32, first: usize, exempt: &Range<usize>, zw: &mut [f32], st: &[f32]) {
        if let Self::Ftrl { beta, l1 } = *self {
            for (j, (z, &n)) in zw.iter_mut().zip(st).enumerate() {
                let l1 = if exempt.contains(&(first + j)) { 0.0 } else { l1 };
                *z = ftrl_weight(*z, n, lr, beta, l1);
            }
        }
    }

    /// FTRL: the window value that reads as weight `w` with no history yet (`n = 0`), for
    /// starting from a model's initial weights; other optimizers store `w` itself.
    pub fn stored(&self, lr: f32, exempt: bool, w: f32) -> f32 {
        match *self {
            Self::Ftrl { beta, l1 } if w != 0.0 => {
                let l1 = if exempt { 0.0 } else { l1 };
                -w * beta / lr - w.signum() * l1
            }
            _ => w,
        }
    }
}

/// The gradient of [`Optimizer::fused_step_in_place`] at one parameter, as the blocked form sums it:
/// from zero, the other rank's part, the own, times the scale, plus the penalty's `l2 w` where
/// `DECAYED`.
#[inline(always)]
fn fused_gradient<const DECAYED: bool>(part: f32, own: f32, scale: f32, l2: f32, w: f32) -> f32 {
    let mut c = 0.0f32;
    c += part;
    c += own;
    // (A scale of 1 is skipped there: times 1 is exact.)
    c *= scale;
    if DECAYED {
        c += l2 * w;
    }
    c
}

/// SGD in one pass ([`Optimizer::fused_step_in_place`]).
///
/// Without another rank's `part` (`PARTED` false, `part` empty), the sum starts from the own
/// part: the blocked form adds no part to its zero either.
fn sgd_fused<const DECAYED: bool, const PARTED: bool>(
    p: Step,
    w: &mut [f32],
    part: &[f32],
    own: &[f32],
    scale: f32,
    l2: f32,
) {
    let a = p.lr;
    let (part, own) = (if PARTED { &part[..w.len()] } else { part }, &own[..w.len()]);
    for j in 0..w.len() {
        let c = fused_gradient::<DECAYED>(if PARTED { part[j] } else { 0.0 }, own[j], scale, l2, w[j]);
        w[j] += c * -a;
    }
}

/// Momentum in one pass ([`Optimizer::fused_step_in_place`]): [`Optimizer::step`]'s rule, then
/// both updates added. `PARTED` as for [`sgd_fused`].
#[allow(clippy::too_many_arguments)]
fn momentum_fused<const DECAYED: bool, const NESTEROV: bool, const PARTED: bool>(
    p: Step,
    mu: f32,
    w: &mut [f32],
    st: &mut [f32],
    part: &[f32],
    own: &[f32],
    scale: f32,
    l2: f32,
) {
    let (a, s, n) = (p.lr, p.share, w.len());
    let (st, part, own) = (&mut st[..n], if PARTED { &part[..n] } else { part }, &own[..n]);
    for j in 0..n {
        let c = fused_gradient::<DECAYED>(if PARTED { part[j] } else { 0.0 }, own[j], scale, l2, w[j]);
        let v = st[j];
        let dv = s * (mu - 1.0) * v + c;
        let c = if NESTEROV { -a * (s * mu * mu * v + (1.0 + mu) * c) } else { -a * (s * mu * v + c) };
        w[j] += c;
        st[j] += dv;
    }
}

/// FTRL-Proximal's weight for `z`, `n` (see the [module docs](self)).
#[inline]
fn ftrl_weight(z: f32, n: f32, a: f32, beta: f32, l1: f32) -> f32 {
    if z.abs() <= l1 {
        0.0
    } else {
        -(z - z.signum() * l1) / ((beta + n.max(0.0).sqrt()) / a)
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Momentum { mu, .. } if mu != MOMENTUM => write!(f, "{}:{mu}", self.name()),
            Self::Adam { beta1, beta2, .. } if (beta1, beta2) != ADAM_BETAS => {
                write!(f, "adam:{beta1},{beta2}")
            }
            _ => f.write_str(self.name()),
        }
    }
}

impl FromStr for Optimizer {
    type Err = String;

    /// `sgd`, `momentum[:MU]`, `nesterov[:MU]`, `adagrad`, `adam[:B1,B2]`, `ftrl`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = s.split_once(':').map_or((s, None), |(n, a)| (n, Some(a)));
        let num = |a: &str, what: &str, ok: fn(f32) -> bool| -> Result<f32, String> {
            a.trim()
                .parse::<f32>()
                .ok()
                .filter(|&x| ok(x))
                .ok_or_else(|| format!("optimizer `{s}`: {what} must be in [0, 1), got `{a}`"))
        };
        let in_unit = |x: f32| (0.0..1.0).contains(&x);
        let o = match (name.trim(), arg) {
            ("sgd", None) => Self::Sgd,
            (n @ ("momentum" | "nesterov"), a) => Self::Momentum {
                mu: a.map_or(Ok(MOMENTUM), |a| num(a, "the momentum", in_unit))?,
                nesterov: n == "nesterov",
            },
            ("adagrad", None) => Self::AdaGrad { eps: EPS },
            ("adam", None) => Self::Adam { beta1: ADAM_BETAS.0, beta2: ADAM_BETAS.1, eps: EPS },
            ("adam", Some(a)) => {
                let (b1, b2) = a
                    .split_once(',')
                    .ok_or_else(|| format!("optimizer `{s}`: give both betas, `adam:0.9,0.999`"))?;
                Self::Adam { beta1: num(b1, "beta1", in_unit)?, beta2: num(b2, "beta2", in_unit)?, eps: EPS }
            }
            ("ftrl", None) => Self::Ftrl { beta: FTRL_BETA, l1: 0.0 },
            (n @ ("sgd" | "adagrad" | "ftrl"), Some(_)) => {
                return Err(format!("optimizer `{s}`: {n} takes no argument"));
            }
            _ => {
                return Err(format!(
                    "unknown optimizer `{s}`: expected sgd, momentum[:MU], nesterov[:MU], adagrad, \
                     adam[:B1,B2] or ftrl"
                ))
            }
        };
        Ok(o)
    }
}

crate::serde_as_name!(Optimizer);

/// How the learning rate changes over a run: a linear warm-up from 0 over the first `warmup`
/// iterations, times a decay.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Iterations of linear warm-up (0: none).
    pub warmup: u64,
    /// The decay after (and during) the warm-up.
    pub decay: Decay,
}

/// A learning-rate decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    /// `1 / (1 + d e)` at epoch `e` (fractional); `d = 0` is a constant rate.
    Inverse(f64),
    /// Half a cosine from 1 at the end of the warm-up to 0 at the last iteration.
    Cosine,
}

impl Default for Decay {
    fn default() -> Self {
        Self::Inverse(0.0)
    }
}

impl fmt::Display for Decay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inverse(d) => write!(f, "{d}"),
            Self::Cosine => f.write_str("cosine"),
        }
    }
}

impl FromStr for Decay {
    type Err = String;

    /// A number `d >= 0` (`1 / (1 + d e)`) or `cosine`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "cosine" {
            return Ok(Self::Cosine);
        }
        match s.trim().parse::<f64>() {
            Ok(d) if d.is_finite() && d >= 0.0 => Ok(Self::Inverse(d)),
            _ => Err(format!("the learning-rate decay must be a number, 0 or more, or `cosine`, got `{s}`")),
        }
    }
}

/// A number in configuration files (`lr-decay = 1.0`), or the string `"cosine"`.
impl serde::Serialize for Decay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Inverse(d) => s.serialize_f64(*d),
            Self::Cosine => s.serialize_str("cosine"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Decay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Decay;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, 0 or more, or \"cosine\"")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Decay, E> {
                v.to_string().parse().map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Decay, E> {
                v.to_string().parse().map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Decay, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Decay, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Schedule {
    /// The factor on the learning rate at iteration `it` (from 0) of a run of `iterations`
    /// iterations of `per_epoch` iterations an epoch.
    pub fn factor(&self, it: u64, per_epoch: u64, iterations: u64) -> f64 {
        let warm = if it < self.warmup { (it + 1) as f64 / (self.warmup + 1) as f64 } else { 1.0 };
        let decay = match self.decay {
            Decay::Inverse(d) => 1.0 / (1.0 + d * it as f64 / per_epoch.max(1) as f64),
            Decay::Cosine => {
                let span = iterations.saturating_sub(self.warmup).max(1) as f64;
                let x = (it.saturating_sub(self.warmup) as f64 / span).min(1.0);
                0.5 * (1.0 + (std::f64::consts::PI * x).cos())
            }
        };
        warm * decay
    }

    /// Whether the rate is the same at every iteration.
    pub fn constant(&self) -> bool {
        self.warmup == 0 && self.decay == Decay::Inverse(0.0)
    }
}

#[cfg(test)]
mod tests;
