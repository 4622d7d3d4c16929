//! Helpers shared by the kernel tests: a seeded generator and the awkward sizes.

/// Lengths every SIMD kernel is checked on: empty, one, around one and two `f32x8`s, and large.
pub(crate) const SIZES: [usize; 10] = [0, 1, 7, 8, 9, 15, 16, 17, 33, 100_003];

/// SplitMix64: small, seeded, good enough for test data.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub(crate) fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Asserts `|got - want| <= rel * scale + abs`, naming the case on failure.
#[track_caller]
pub(crate) fn assert_close(got: f64, want: f64, scale: f64, rel: f64, abs: f64, what: &str) {
    let tol = rel * scale + abs;
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, want {want}, |diff| {} > tol {tol}",
        (got - want).abs()
    );
}
