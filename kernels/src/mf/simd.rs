//! SIMD kernels: `f32x8` dot and update over the `k` factors.

use wide::{f32x4, f32x8};

use super::check;
use crate::dense::simd::{dot, load, reduce_add4, store, LANES};

/// One SGD step per rating, in order; returns `sum e^2` with each `e = r - u . v` taken before
/// its own update: `u <- u + lr (e v - l2 u)`, `v <- v + lr (e u_old - l2 v)`, computed as
/// `u <- (1 - lr l2) u + (lr e) v_old`, `v <- (1 - lr l2) v + (lr e) u_old`.
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

/// As [`sgd_chunk`] with biases: rows of `k + 1` values (the factors, then the user's or item's
/// bias) and `e = r - (mean + b_u + b_i + u . v)`; the biases step as the factors do,
/// `b <- b + lr (e - l2 b)`.
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
    let decay = 1.0 - lr * l2;
    let vdecay = f32x8::splat(decay);
    let mut sse = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (uid, iid) = (uid as usize, iid as usize);
        let (ur, ub) = u[uid * stride..(uid + 1) * stride].split_at_mut(k);
        let (vr, vb) = v[iid * stride..(iid + 1) * stride].split_at_mut(k);
        let bias = mean.map_or(0.0, |m| m + ub[0] + vb[0]);
        let e = r - bias - dot(ur, vr);
        sse += f64::from(e * e);
        let step = lr * e;
        if mean.is_some() {
            ub[0] = step.mul_add(1.0, decay * ub[0]);
            vb[0] = step.mul_add(1.0, decay * vb[0]);
        }
        let vstep = f32x8::splat(step);
        let mut u8 = ur.chunks_exact_mut(LANES);
        let mut v8 = vr.chunks_exact_mut(LANES);
        for (cu, cv) in (&mut u8).zip(&mut v8) {
            let (a, b) = (load(cu), load(cv));
            store(cu, vstep.mul_add(b, vdecay * a));
            store(cv, vstep.mul_add(a, vdecay * b));
        }
        for (a, b) in u8.into_remainder().iter_mut().zip(v8.into_remainder()) {
            let (ua, vb) = (*a, *b);
            *a = step.mul_add(vb, decay * ua);
            *b = step.mul_add(ua, decay * vb);
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
/// the first factors (and the biases) step, as in libmf's first epoch. One pass over each group
/// after the dot product: gradients, their squares and the step together.
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
    if k.is_multiple_of(LANES) && super::FIRST == LANES {
        return adaptive_whole(users, items, ratings, u, v, k, lr, l2, mean, first_pass);
    }
    let first = k.min(super::FIRST);
    let rest = !first_pass && k > first;
    let (per_first, per_rest) = (1.0 / first as f32, 1.0 / (k - first).max(1) as f32);
    let mut sse = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (uid, iid) = (uid as usize, iid as usize);
        let (ur, ut) = u[uid * stride..(uid + 1) * stride].split_at_mut(k);
        let (vr, vt) = v[iid * stride..(iid + 1) * stride].split_at_mut(k);
        let (eu, ev) = (lr / ut[bias].sqrt(), lr / vt[bias].sqrt());
        let e = r - mean.map_or(0.0, |m| m + ut[0] + vt[0]) - dot(ur, vr);
        sse += f64::from(e * e);
        if mean.is_some() {
            ut[0] += eu * (e - l2 * ut[0]);
            vt[0] += ev * (e - l2 * vt[0]);
        }
        let (u1, u2) = ur.split_at_mut(first);
        let (v1, v2) = vr.split_at_mut(first);
        let (su, sv) = adaptive_step(u1, v1, e, eu, ev, l2);
        ut[bias] += su * per_first;
        vt[bias] += sv * per_first;
        if rest {
            let (eu, ev) = (lr / ut[bias + 1].sqrt(), lr / vt[bias + 1].sqrt());
            let (su, sv) = adaptive_step(u2, v2, e, eu, ev, l2);
            ut[bias + 1] += su * per_rest;
            vt[bias + 1] += sv * per_rest;
        }
    }
    sse
}

/// [`sgd_chunk_adaptive`] for `k` a multiple of 8 (the first group one vector, the rest whole
/// vectors), the same steps in fewer instructions: the dot product in two accumulators inline,
/// each vector loaded for its step where it is needed rather than held through the dot product
/// (16 registers do not hold two rows of 40), and the four `G`s' sums of squares reduced at once
/// ([`reduce_add4`]) and added in one vector. On a Zen 4 at k = 40 (one core, 1024 ratings over
/// rows in cache, the users taking turns) a rating took 15.2-16.5 ns against 18.7-20.0 ns for the
/// general loop (criterion, `mf/adaptive_simd`).
#[allow(clippy::too_many_arguments)]
fn adaptive_whole(
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
    let vectors = k / LANES;
    let rest = !first_pass && vectors > 1;
    // Each `G` grows by its group's mean squared gradient; the rest's by nothing when it rests.
    let per_rest = if rest { 1.0 / (k - LANES) as f32 } else { 0.0 };
    let per = f32x4::from([1.0 / LANES as f32, 1.0 / LANES as f32, per_rest, per_rest]);
    let (vlr, vl2) = (f32x4::splat(lr), f32x8::splat(l2));
    let at = |row: &[f32], j: usize| load(&row[j * LANES..(j + 1) * LANES]);
    let mut sse = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (uid, iid) = (uid as usize, iid as usize);
        let (ur, ut) = u[uid * stride..(uid + 1) * stride].split_at_mut(k);
        let (vr, vt) = v[iid * stride..(iid + 1) * stride].split_at_mut(k);
        // The rates of both groups, from the `G`s before this rating (lanes: u first, v first,
        // u rest, v rest), each rounded as the scalar `lr / G.sqrt()`.
        let g = f32x4::from([ut[bias], vt[bias], ut[bias + 1], vt[bias + 1]]);
        let rates = (vlr / g.sqrt()).to_array();
        let (mut a0, mut a1) = (at(ur, 0) * at(vr, 0), f32x8::ZERO);
        for j in 1..vectors {
            if j % 2 == 1 {
                a1 = at(ur, j).mul_add(at(vr, j), a1);
            } else {
                a0 = at(ur, j).mul_add(at(vr, j), a0);
            }
        }
        let e = r - mean.map_or(0.0, |m| m + ut[0] + vt[0]) - (a0 + a1).reduce_add();
        sse += f64::from(e * e);
        if mean.is_some() {
            ut[0] += rates[0] * (e - l2 * ut[0]);
            vt[0] += rates[1] * (e - l2 * vt[0]);
        }
        let ve = f32x8::splat(e);
        // Vector `j` of both rows at rates `eu`, `ev`; adds the squared gradients to `s`.
        let step =
            |ur: &mut [f32], vr: &mut [f32], j: usize, (eu, ev): (f32x8, f32x8), s: &mut (f32x8, f32x8)| {
                let (x, y) = (at(ur, j), at(vr, j));
                let (gu, gv) = (vl2.mul_sub(x, ve * y), vl2.mul_sub(y, ve * x));
                s.0 = gu.mul_add(gu, s.0);
                s.1 = gv.mul_add(gv, s.1);
                store(&mut ur[j * LANES..(j + 1) * LANES], eu.mul_neg_add(gu, x));
                store(&mut vr[j * LANES..(j + 1) * LANES], ev.mul_neg_add(gv, y));
            };
        let (mut first, mut others) = ((f32x8::ZERO, f32x8::ZERO), (f32x8::ZERO, f32x8::ZERO));
        step(ur, vr, 0, (f32x8::splat(rates[0]), f32x8::splat(rates[1])), &mut first);
        if rest {
            let rate = (f32x8::splat(rates[2]), f32x8::splat(rates[3]));
            for j in 1..vectors {
                step(ur, vr, j, rate, &mut others);
            }
        }
        let g = reduce_add4(first.0, first.1, others.0, others.1).mul_add(per, g).to_array();
        (ut[bias], vt[bias], ut[bias + 1], vt[bias + 1]) = (g[0], g[1], g[2], g[3]);
    }
    sse
}

/// One adaptive step of a user row's factors `a` and an item row's `b` (equal lengths) for
/// error `e` at rates `eu`, `ev`: `a <- a - eu gu`, `b <- b - ev gv` with `gu = l2 a - e b`,
/// `gv = l2 b - e a`; returns `(sum gu^2, sum gv^2)`.
#[inline(always)]
fn adaptive_step(a: &mut [f32], b: &mut [f32], e: f32, eu: f32, ev: f32, l2: f32) -> (f32, f32) {
    let (ve, veu, vev, vl2) = (f32x8::splat(e), f32x8::splat(eu), f32x8::splat(ev), f32x8::splat(l2));
    let (mut su, mut sv) = (f32x8::ZERO, f32x8::ZERO);
    let mut a8 = a.chunks_exact_mut(LANES);
    let mut b8 = b.chunks_exact_mut(LANES);
    for (ca, cb) in (&mut a8).zip(&mut b8) {
        let (x, y) = (load(ca), load(cb));
        let (gu, gv) = (vl2.mul_sub(x, ve * y), vl2.mul_sub(y, ve * x));
        su = gu.mul_add(gu, su);
        sv = gv.mul_add(gv, sv);
        store(ca, veu.mul_neg_add(gu, x));
        store(cb, vev.mul_neg_add(gv, y));
    }
    let (mut su, mut sv) = (su.reduce_add(), sv.reduce_add());
    for (a, b) in a8.into_remainder().iter_mut().zip(b8.into_remainder()) {
        let (x, y) = (*a, *b);
        let (gu, gv) = (l2 * x - e * y, l2 * y - e * x);
        su += gu * gu;
        sv += gv * gv;
        *a = x - eu * gu;
        *b = y - ev * gv;
    }
    (su, sv)
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
    let (ve, vl2) = (f32x8::splat(-e), f32x8::splat(l2));
    let mut gu8 = gu.chunks_exact_mut(LANES);
    let mut gv8 = gv.chunks_exact_mut(LANES);
    let (u8, v8) = (u_row.chunks_exact(LANES), v_row.chunks_exact(LANES));
    let (u_tail, v_tail) = (u8.remainder(), v8.remainder());
    for (((cgu, cgv), cu), cv) in (&mut gu8).zip(&mut gv8).zip(u8).zip(v8) {
        let (a, b) = (load(cu), load(cv));
        store(cgu, ve.mul_add(b, vl2.mul_add(a, load(cgu))));
        store(cgv, ve.mul_add(a, vl2.mul_add(b, load(cgv))));
    }
    for (((gu, gv), &a), &b) in
        gu8.into_remainder().iter_mut().zip(gv8.into_remainder()).zip(u_tail).zip(v_tail)
    {
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

/// As [`sse`] with biases (rows of `k + 1` values, see [`sgd_chunk_biased`]).
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
pub fn sse_biased(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &[f32],
    v: &[f32],
    k: usize,
    mean: f32,
) -> f64 {
    super::sse_with(dot, users, items, ratings, u, v, k, k + 1, Some(mean))
}

/// As [`sse`] (with biases when `mean` is given) over rows of `stride` values whose first `k`
/// are the factors and the next, with biases, the bias (the rest, such as
/// [`sgd_chunk_adaptive`]'s `G`s, is not read).
///
/// # Panics
/// On inconsistent lengths, `stride` below the values read, or an out-of-range id.
#[allow(clippy::too_many_arguments)]
pub fn sse_rows(
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &[f32],
    v: &[f32],
    k: usize,
    stride: usize,
    mean: Option<f32>,
) -> f64 {
    super::sse_with(dot, users, items, ratings, u, v, k, stride, mean)
}

/// `sqrt(sse / n)`, 0 for no ratings.
///
/// # Panics
/// On inconsistent lengths or an out-of-range id.
pub fn rmse(users: &[u32], items: &[u32], ratings: &[f32], u: &[f32], v: &[f32], k: usize) -> f64 {
    super::rmse_with(dot, users, items, ratings, u, v, k)
}
