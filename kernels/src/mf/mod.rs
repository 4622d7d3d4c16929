//! Matrix factorization: `r_ui ~ u_u . v_i`, factors `U` (`n_users x k`) and `V` (`n_items x k`),
//! row-major.
//!
//! Per rating, `e = r - u . v` and the objective `f = 0.5 e^2 + 0.5 l2 (|u|^2 + |v|^2)` has
//! `df/du = -e v + l2 u`, `df/dv = -e u + l2 v`. [`sgd_chunk`] takes one SGD step per rating, in
//! order: `u <- u + lr (e v - l2 u)`, `v <- v + lr (e u_old - l2 v)`; [`loss_grad_row`] returns
//! the gradients for the parameter-server path instead.
//!
//! - [`scalar`]: the reference, sequential dot, the update written exactly as above.
//! - [`simd`]: the public functions: `f32x8` dot and update (`u <- (1 - lr l2) u + (lr e) v`,
//!   the same update with the constants factored out).
//!
//! With biases ([`sgd_chunk_biased`], [`sse_biased`]) each row holds its `k` factors then a bias,
//! the prediction is `mean + b_u + b_i + u . v` (`mean` a constant, the training ratings' mean),
//! and the biases take the same regularized step as the factors.
//!
//! Ids must be in range (`uid < u.len() / k`, `iid < v.len() / k`); out-of-range ids and length
//! mismatches are programming errors and panic.

pub mod scalar;
pub mod simd;

pub use simd::{
    loss_grad_row, rmse, sgd_chunk, sgd_chunk_adaptive, sgd_chunk_biased, sse, sse_biased, sse_rows,
};

/// `sum (r - u . v)^2` with the given dot product (scalar or SIMD), over rows of `stride` values:
/// the `k` factors, then with `mean` the bias (`e = r - (mean + b_u + b_i + u . v)`), then any
/// others (adaptive rates' `G`s), which are not read.
#[allow(clippy::too_many_arguments)]
fn sse_with(
    dot: fn(&[f32], &[f32]) -> f32,
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &[f32],
    v: &[f32],
    k: usize,
    stride: usize,
    mean: Option<f32>,
) -> f64 {
    assert!(stride >= k + usize::from(mean.is_some()), "mf: rows of {stride} values cannot hold k = {k}");
    check(users, items, ratings, u, v, stride);
    let mut s = 0.0f64;
    for ((&uid, &iid), &r) in users.iter().zip(items).zip(ratings) {
        let (ur, vr) = (&u[uid as usize * stride..][..stride], &v[iid as usize * stride..][..stride]);
        let bias = mean.map_or(0.0, |m| m + ur[k] + vr[k]);
        let e = r - bias - dot(&ur[..k], &vr[..k]);
        s += f64::from(e * e);
    }
    s
}

/// `sqrt(sse / n)` with the given dot product, 0 for no ratings.
fn rmse_with(
    dot: fn(&[f32], &[f32]) -> f32,
    users: &[u32],
    items: &[u32],
    ratings: &[f32],
    u: &[f32],
    v: &[f32],
    k: usize,
) -> f64 {
    if ratings.is_empty() {
        return 0.0;
    }
    (sse_with(dot, users, items, ratings, u, v, k, k, None) / ratings.len() as f64).sqrt()
}

/// Checks the shapes shared by both versions (`k`: values per row).
fn check(users: &[u32], items: &[u32], ratings: &[f32], u: &[f32], v: &[f32], k: usize) {
    assert_eq!(users.len(), ratings.len(), "mf: users and ratings differ in length");
    assert_eq!(items.len(), ratings.len(), "mf: items and ratings differ in length");
    assert!(k > 0, "mf: k must be positive");
    assert_eq!(u.len() % k, 0, "mf: u.len() is not a multiple of k");
    assert_eq!(v.len() % k, 0, "mf: v.len() is not a multiple of k");
}

/// Reorders `piece` (indices of ratings sorted by user; `users[j]` is rating `j`'s user) so that
/// its users take turns: each user's first rating, then each one's second, and so on (within a
/// turn, by user). Neighbouring ratings then seldom share a row, and the kernel's steps, which
/// would otherwise wait for the previous step's store of the same user row, overlap: on a Zen 4
/// the adaptive kernel at k = 40 took 15 ns a rating in this order against 19-21 ns sorted by
/// user (1024 ratings over rows in cache). MF's strata lay out their pieces so; the test RMSE on
/// the tuning sets of `docs/defaults.md` (r1, r2; 5 and 20 epochs, with and without biases)
/// moved by 0.0016 at most, either way.
///
/// # Panics
/// If an index in `piece` is out of range of `users`.
pub fn take_turns(piece: &mut [usize], users: &[u32]) {
    let mut turn = 0u32;
    let mut keyed: Vec<(u32, u32, usize)> = Vec::with_capacity(piece.len());
    for (t, &j) in piece.iter().enumerate() {
        turn = if t > 0 && users[j] == users[piece[t - 1]] { turn + 1 } else { 0 };
        keyed.push((turn, users[j], j));
    }
    // A user has one rating a turn: the keys are distinct.
    keyed.sort_unstable_by_key(|&(turn, user, _)| (turn, user));
    for (dst, (_, _, j)) in piece.iter_mut().zip(keyed) {
        *dst = j;
    }
}

/// Factors in the first group of an adaptive row ([`sgd_chunk_adaptive`]): libmf's AVX build
/// splits each row after its first vector of 8 floats.
pub const FIRST: usize = 8;

#[cfg(test)]
mod tests;
