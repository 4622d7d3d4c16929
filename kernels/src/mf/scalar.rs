//! Scalar reference: sequential dot, the update exactly as in the module doc.

use super::check;
use crate::dense::scalar::dot;

/// One SGD step per rating, in order; returns `sum e^2` with each `e = r - u . v` taken before
/// its own update: `u <- u + lr (e v - l2 u)`, `v <- v + lr (e u_old - l2 v)`.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
#[allow(clippy::too_many_arguments)]
pub fn sgd_chunk(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &mut [f32],
    v: &mut [f32],
    k: usize,
    lr: f32,
    l2: f32,
) -> f64 {
    sgd(users, items, ratings, u, v, k, lr, l2, None)
}

/// As [`sgd_chunk`] with biases (see `simd::sgd_chunk_biased`): `b <- b + lr (e - l2 b)`.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
#[allow(clippy::too_many_arguments)]
pub fn sgd_chunk_biased(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &mut [f32],
    v: &mut [f32],
    k: usize,
    lr: f32,
    l2: f32,
    mean: f32,
) -> f64 {
    sgd(users, items, ratings, u, v, k, lr, l2, Some(mean))
}

#[allow(clippy::too_many_arguments)]
fn sgd(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &mut [f32],
    v: &mut [f32],
    k: usize,
    lr: f32,
    l2: f32,
    mean: Option<f32>,
) -> f64 {
    let stride = k + usize::from(mean.is_some());
    check(users, items, ratings, u, v, stride);
    let mut sse = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (uid, iid) = (uid as usize, iid as usize);
        let (ur, ub) = u[uid * stride..(uid + 1) * stride].split_at_mut(k);
        let (vr, vb) = v[iid * stride..(iid + 1) * stride].split_at_mut(k);
        let e = r - mean.map_or(0.0, |m| m + ub[0] + vb[0]) - dot(ur, vr);
        sse += f64::from(e * e);
        if mean.is_some() {
            ub[0] += lr * (e - l2 * ub[0]);
            vb[0] += lr * (e - l2 * vb[0]);
        }
        for (a, b) in ur.iter_mut().zip(vr.iter_mut()) {
            let u_old = *a;
            *a += lr * (e * *b - l2 * u_old);
            *b += lr * (e * u_old - l2 * *b);
        }
    }
    sse
}

/// As [`sgd_chunk`] (with biases when `mean` is given) under per-row adaptive rates (libmf's
/// schedule, Chin et al. 2015, as libmf's AVX build runs it): each row ends with two `G`s, the
/// running mean squared gradients of its first [`FIRST`](super::FIRST) factors and of the
/// others (1 to start). A rating steps each group of a user row by `lr / sqrt(G)` of that group
/// (the rates taken before the step), then adds to the group's `G` the mean of its squared
/// gradients; items likewise. Biases step at their row's first rate. In the `first_pass` only
/// the first factors (and the biases) step, as libmf's first epoch.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
#[allow(clippy::too_many_arguments)]
pub fn sgd_chunk_adaptive(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &mut [f32],
    v: &mut [f32],
    k: usize,
    lr: f32,
    l2: f32,
    mean: Option<f32>,
    first_pass: bool,
) -> f64 {
    let bias = usize::from(mean.is_some());
    let stride = k + bias + 2;
    check(users, items, ratings, u, v, stride);
    let first = k.min(super::FIRST);
    let groups: &[(std::ops::Range<usize>, usize)] =
        if first_pass { &[(0..first, 0)][..] } else { &[(0..first, 0), (first..k, 1)][..] };
    let mut sse = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (uid, iid) = (uid as usize, iid as usize);
        let ur = &mut u[uid * stride..(uid + 1) * stride];
        let vr = &mut v[iid * stride..(iid + 1) * stride];
        let g = k + bias;
        let rate = |row: &[f32], group: usize| lr / row[g + group].sqrt();
        let (eu, ev) = (rate(ur, 0), rate(vr, 0));
        let mut e = r - (0..k).map(|d| ur[d] * vr[d]).sum::<f32>();
        if let Some(m) = mean {
            e -= m + ur[k] + vr[k];
        }
        sse += f64::from(e * e);
        if mean.is_some() {
            ur[k] += eu * (e - l2 * ur[k]);
            vr[k] += ev * (e - l2 * vr[k]);
        }
        for (dims, group) in groups.iter().filter(|(d, _)| !d.is_empty()) {
            let (eu, ev) = (rate(ur, *group), rate(vr, *group));
            let (mut su, mut sv) = (0.0f32, 0.0f32);
            for d in dims.clone() {
                let (a, b) = (ur[d], vr[d]);
                let (gu, gv) = (l2 * a - e * b, l2 * b - e * a);
                su += gu * gu;
                sv += gv * gv;
                ur[d] = a - eu * gu;
                vr[d] = b - ev * gv;
            }
            ur[g + group] += su / dims.len() as f32;
            vr[g + group] += sv / dims.len() as f32;
        }
    }
    sse
}

/// Squared error `e^2`, `e = r - u . v`, and `gu <- gu + (-e v + l2 u)`,
/// `gv <- gv + (-e u + l2 v)`: the gradients of `0.5 e^2 + 0.5 l2 (|u|^2 + |v|^2)`, accumulated.
///
/// # Panics
/// If the four slices differ in length.
pub fn loss_grad_row(r: f32, u_row: &[f32], v_row: &[f32], l2: f32, gu: &mut [f32], gv: &mut [f32]) -> f32 {
    assert_eq!(gu.len(), u_row.len(), "loss_grad_row: gu and u_row differ in length");
    assert_eq!(gv.len(), v_row.len(), "loss_grad_row: gv and v_row differ in length");
    let e = r - dot(u_row, v_row);
    for (((gu, gv), &a), &b) in gu.iter_mut().zip(gv.iter_mut()).zip(u_row).zip(v_row) {
        *gu += -e * b + l2 * a;
        *gv += -e * a + l2 * b;
    }
    e * e
}

/// `sum (r - u . v)^2` over the ratings (no update). Across ranks, reduce the sums and the
/// counts, then take `sqrt(total_sse / total_n)`.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
pub fn sse(users: &[u32], items: &[u32], ratings: &[f32], u: &[f32], v: &[f32], k: usize) -> f64 {
    super::sse_with(dot, users, items, ratings, u, v, k, k, None)
}

/// `sqrt(sse / n)`, 0 for no ratings.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
pub fn rmse(users: &[u32], items: &[u32], ratings: &[f32], u: &[f32], v: &[f32], k: usize) -> f64 {
    super::rmse_with(dot, users, items, ratings, u, v, k)
}
