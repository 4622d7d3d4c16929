//! Scalar reference kernels: sequential loops, the definition of correct.

/// `sum_i a[i] * b[i]`, summed strictly left to right.
///
/// # Panics
/// If `a.len() != b.len()`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut s = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// `y <- y + alpha * x`.
///
/// # Panics
/// If `x.len() != y.len()`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `x <- alpha * x`.
pub fn scale(alpha: f32, x: &mut [f32]) {
    for xi in x {
        *xi *= alpha;
    }
}

/// `|x|^2 = sum_i x[i]^2`, summed strictly left to right.
pub fn sq_norm(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for xi in x {
        s += xi * xi;
    }
    s
}
