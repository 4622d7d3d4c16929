//! Small dense MLP layers (MNIST-sized, 784-128-10): matrix products, dense layers, ReLU and
//! softmax cross-entropy.
//!
//! Matrices are row-major. A dense layer with `n_in` inputs and `n_out` outputs stores `b` as
//! `n_out` and `W` in one of two orders ([`Weights`]); a batch `X` is `n x n_in`:
//! - [`Weights::OutIn`], `W` as `n_out x n_in` (one row per output, as PyTorch does): forward
//!   ([`dense_forward`]) `Y = X W^T + b`, a product `A B^T`; backward ([`dense_backward`])
//!   `grad_W += dY^T X` (`A^T B`), `grad_b += 1^T dY`, `grad_X = dY W` (`A B`);
//! - [`Weights::InOut`], `V = W^T` stored as `n_in x n_out` (one row per input): forward
//!   `Y = X V + b` (`A B`), backward `grad_V += X^T dY` (`A^T B`), `grad_X = dY V^T` (`A B^T`).
//!
//! Both operands of the forward run along `n_in` in the first order, so one of them is
//! transposed into panels on every call; in the second the forward reads both as stored and the
//! weight gradient reads `X^T` in place too, each step's values side by side (see [`Weights`] for
//! what it saves).
//!
//! [`Matmul`] runs `C <- alpha op(A) op(B) + beta C` with one of three [`Backend`]s:
//! [`scalar::gemm`] (the reference), [`simd::gemm`] (our own kernel: a 6x16 `f32x8` or an 8x32
//! AVX-512 micro-kernel, the CPU's choosing at run time; a transposed `B` packed) and [`mmul::gemm`] (`matrixmultiply::sgemm`). It owns the
//! packing buffers of the `wide` kernel, so the layers allocate nothing once warm.
//!
//! Which backend the layers use by default ([`Backend::default`]) was decided by
//! `benches/benches/kernels.rs` (`mlp_step/*`: forward + backward of 784-128-10, one core), in
//! microseconds per batch, the range over three native runs and two "Zen 3" runs (the 2-core
//! machine is shared, so expect +-10%). The development machine turned out to be a Zen 4
//! (AVX-512): in the native build `matrixmultiply` picks its AVX-512 kernel at run time. The
//! "Zen 3" columns emulate the AVX2+FMA cluster nodes:
//! `RUSTFLAGS="-C target-cpu=znver3"` and `MMTEST_FEATURE=avx,avx2,fma` (a build-time switch of
//! `matrixmultiply` that limits it to its AVX2+FMA kernel).
//!
//! | batch | wide, native | matrixmultiply, native | wide, Zen 3 | matrixmultiply, Zen 3 |
//! |------:|-------------:|-----------------------:|------------:|----------------------:|
//! |    32 |    181 - 210 |              191 - 214 |   218 - 234 |             233 - 242 |
//! |    64 |    290 - 385 |              321 - 404 |   348 - 365 |             392 - 407 |
//! |   128 |    552 - 708 |              579 - 746 |   657 - 688 |             757 - 762 |
//! |   256 |  1134 - 1468 |            1141 - 1350 | 1544 - 1548 |           1494 - 1507 |
//!
//! (The scalar reference takes 44,000 - 54,000 us at batch 256.) Our kernel is ahead at 32 to
//! 128 and within noise or a few percent behind at 256 (where `matrixmultiply` is faster on the
//! `A^T B` weight gradient), and it allocates nothing per call while `matrixmultiply::sgemm`
//! allocates its packing buffer on every call: the default is [`Backend::Wide`]. (These are the
//! figures of our kernel before its blocks changed, `simd::KC` 256 -> 1024 and tiles along the
//! rows of `C` for a small packed `B`: 4-8 % less time on the products of a 64-row chunk since,
//! and untransposed operands read in place, 2-5 % less again: both measured in `simd`'s docs;
//! the choice stands.) On an Intel Xeon with AVX-512, where both ours and `matrixmultiply` pick
//! their AVX-512 kernels at run time, one run of `mlp_*`: fwd+bwd 112, 240, 403, 876 us at
//! batches 32, 64, 128, 256 against 124, 216, 402, 826 us for `matrixmultiply` (and 169, 312,
//! 610, 1213 us for our `f32x8` kernel): level within the machine's noise, and ours allocates
//! nothing; the choice stands there too.

pub mod mmul;
pub mod scalar;
pub mod simd;

pub use simd::{relu, relu_backward, softmax_cross_entropy};

/// How a row-major operand enters a product: as stored (`N`) or transposed (`T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `op(X) = X`.
    N,
    /// `op(X) = X^T`.
    T,
}

impl Op {
    /// `(row stride, column stride)` of `op(X)` when `op(X)` is `rows x cols` and `X` is stored
    /// row-major: `(cols, 1)` for `N`, `(1, rows)` for `T` (`X` itself is `cols x rows`).
    pub fn strides(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Op::N => (cols, 1),
            Op::T => (1, rows),
        }
    }
}

/// The order in which a dense layer stores its weights (see the [module docs](self)).
///
/// [`InOut`](Weights::InOut) is the order for speed with our kernel ([`Backend::Wide`]): the
/// `n_out x n_in` order makes every forward transpose an operand into panels (`X^T`, 200 KB
/// for a 64-row chunk of 784 inputs, by 8x8 shuffles that share the port of the FMAs on Intel
/// cores), and the layer's weight gradient then reads `dY^T`, the one the 784-wide operand is
/// not. Measured in one process on an Intel Xeon (AVX-512), the forward and backward of a
/// 64-row chunk of 784-128-10, the two orders alternated in 6 rounds of 2000 chunks: 212-221 us
/// `n_out x n_in`, 190-203 us `n_in x n_out` (the forward alone 91-97 -> 82-84 us); MLP training
/// on 2 MPI ranks at batch 128, 5 runs of each binary alternated: 296k-346k -> 340k-355k samples/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    /// `W` as `n_out x n_in`: a row per output (PyTorch's `nn.Linear`).
    OutIn,
    /// `W^T` as `n_in x n_out`: a row per input.
    InOut,
}

/// A matrix product implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`scalar::gemm`]: the reference triple loop.
    Scalar,
    /// [`simd::gemm`]: our kernel (6x16 `f32x8`, or 8x32 AVX-512 where the CPU has it).
    Wide,
    /// [`mmul::gemm`]: `matrixmultiply::sgemm`.
    MatrixMultiply,
}

impl Default for Backend {
    /// [`Backend::Wide`], the fastest at the 784-128-10 shapes for batches of 32 to 128 and
    /// level at 256 (see the module doc).
    fn default() -> Self {
        Backend::Wide
    }
}

/// Matrix products `C <- alpha op(A) op(B) + beta C` with a chosen [`Backend`], plus the packing
/// buffers it needs (reuse one `Matmul` across calls).
#[derive(Debug, Clone, Default)]
pub struct Matmul {
    backend: Backend,
    isa: simd::Isa,
    pack: simd::Pack,
    /// [`dense_forward`]'s `Y^T`, kept between calls.
    yt: Vec<f32>,
    /// Rows the caller reads next, asked for by the products meanwhile ([`Matmul::warm`]).
    warm: simd::Warm,
}

impl Matmul {
    /// A product runner for `backend` (with [`Backend::Wide`], the widest micro-kernel the CPU
    /// runs: [`simd::Isa::best`]).
    pub fn new(backend: Backend) -> Self {
        Matmul::with_isa(backend, simd::Isa::best())
    }

    /// A product runner for `backend` whose [`Backend::Wide`] kernel is `isa`'s.
    ///
    /// # Panics
    /// If the CPU does not run `isa` ([`simd::Isa::available`]).
    pub fn with_isa(backend: Backend, isa: simd::Isa) -> Self {
        assert!(isa.available(), "Matmul: this CPU does not run {} instructions", isa.name());
        Matmul { backend, isa, pack: simd::Pack::default(), yt: Vec::new(), warm: simd::Warm::default() }
    }

    /// The backend this runner uses.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The instructions of [`Backend::Wide`]'s micro-kernel.
    pub fn isa(&self) -> simd::Isa {
        self.isa
    }

    /// Asks for `rows` (their first quarter of the core's L2, at most) in L2 during the next
    /// products ([`Backend::Wide`]): a line per turn of each micro-kernel loop that has no panel
    /// of its own to ask for ahead, until all of them are asked for or another call replaces
    /// them. For the rows a thread computes next (its next chunk), whose first product would
    /// otherwise wait on memory. A hint: wrong rows cost only memory bandwidth.
    pub fn warm(&mut self, rows: &[f32]) {
        self.warm = simd::Warm::new(rows);
    }

    /// Lines of the last [`warm`](Self::warm) not asked for yet.
    pub fn warm_left(&self) -> usize {
        self.warm.left()
    }

    /// `C <- alpha op(A) op(B) + beta C`, row-major, `op(A)` `m x k`, `op(B)` `k x n`, `C`
    /// `m x n`: `(N, N)` is `A B`, `(N, T)` is `A B^T`, `(T, N)` is `A^T B`. With `beta == 0`,
    /// `C` is only written.
    ///
    /// # Panics
    /// If `a.len() != m k`, `b.len() != k n` or `c.len() != m n`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &mut self,
        op_a: Op,
        op_b: Op,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        beta: f32,
        c: &mut [f32],
    ) {
        match self.backend {
            Backend::Scalar => scalar::gemm(op_a, op_b, m, n, k, alpha, a, b, beta, c),
            Backend::Wide => simd::gemm(
                self.isa,
                op_a,
                op_b,
                m,
                n,
                k,
                alpha,
                a,
                b,
                beta,
                c,
                &mut self.pack,
                &mut self.warm,
            ),
            Backend::MatrixMultiply => mmul::gemm(op_a, op_b, m, n, k, alpha, a, b, beta, c),
        }
    }
}

/// Layer shapes `(n, n_in, n_out)` from `x` (`n x n_in`), `w` (`n_in n_out` values in either
/// order), `b` (`n_out`).
fn layer_shapes(x: &[f32], w: &[f32], b: &[f32]) -> (usize, usize, usize) {
    let n_out = b.len();
    assert!(n_out > 0, "dense layer: no outputs (b is empty)");
    assert_eq!(w.len() % n_out, 0, "dense layer: w.len() is not a multiple of n_out = b.len()");
    let n_in = w.len() / n_out;
    assert!(n_in > 0, "dense layer: no inputs (w is empty)");
    assert_eq!(x.len() % n_in, 0, "dense layer: x.len() is not a multiple of n_in");
    (x.len() / n_in, n_in, n_out)
}

/// Forward pass of a dense layer: `Y <- X W^T + b` (`X` `n x n_in`, `W` as `order` says, `b`
/// `n_out`, `Y` `n x n_out`; `Y` is overwritten).
///
/// [`Weights::InOut`]: the product `X V` reads both operands as stored. [`Weights::OutIn`]:
/// both `X` and `W` run along `n_in`, so one of them is packed (transposed) for the product:
/// `W^T` for `X W^T`, `X^T` for `(W X^T)^T`. With fewer rows than outputs (a 64-row chunk of a
/// 784-128 layer), the product is taken as `Y^T = W X^T + b 1^T`, which packs the smaller
/// operand, then transposed into `Y`: the forward and backward of a 64-row chunk of 784-128-10
/// took 212-221 us against 219-227 us (AVX-512 kernel, Intel Xeon, both ways alternated in one
/// process, three rounds). Our own kernel only ([`Backend::Wide`]): the others keep `X W^T`.
///
/// # Panics
/// On inconsistent shapes.
pub fn dense_forward(mm: &mut Matmul, x: &[f32], w: &[f32], order: Weights, b: &[f32], y: &mut [f32]) {
    let (n, n_in, n_out) = layer_shapes(x, w, b);
    assert_eq!(y.len(), n * n_out, "dense_forward: y is not n x n_out");
    if order == Weights::InOut || n >= n_out || mm.backend != Backend::Wide {
        for row in y.chunks_exact_mut(n_out) {
            row.copy_from_slice(b);
        }
        let op_w = if order == Weights::InOut { Op::N } else { Op::T };
        mm.matmul(Op::N, op_w, n, n_out, n_in, 1.0, x, w, 1.0, y);
        return;
    }
    let mut yt = std::mem::take(&mut mm.yt);
    yt.clear();
    yt.resize(n * n_out, 0.0);
    for (row, &bj) in yt.chunks_exact_mut(n).zip(b) {
        row.fill(bj);
    }
    mm.matmul(Op::N, Op::T, n_out, n, n_in, 1.0, w, x, 1.0, &mut yt);
    transpose(&yt, n_out, n, y);
    mm.yt = yt;
}

/// `out <- a^T` for a row-major `rows x cols` `a`, in tiles of 8 x 8 (each read and written a
/// few cache lines at a time).
///
/// # Panics
/// If `a` or `out` holds fewer than `rows cols` values.
pub fn transpose(a: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const T: usize = 8;
    for i0 in (0..rows).step_by(T) {
        for j0 in (0..cols).step_by(T) {
            for i in i0..(i0 + T).min(rows) {
                for j in j0..(j0 + T).min(cols) {
                    out[j * rows + i] = a[i * cols + j];
                }
            }
        }
    }
}

/// Backward pass of a dense layer, given `dY = dL/dY` (`n x n_out`) and `W` as `order` says:
/// `grad_W <- grad_W + dY^T X` (`grad_V <- grad_V + X^T dY` for [`Weights::InOut`], in `V`'s
/// order), `grad_b <- grad_b + sum_rows dY` (both accumulated, not zeroed), and, if given,
/// `grad_X <- dY W` (overwritten; pass `None` for the first layer).
///
/// # Panics
/// On inconsistent shapes.
#[allow(clippy::too_many_arguments)]
pub fn dense_backward(
    mm: &mut Matmul,
    x: &[f32],
    w: &[f32],
    order: Weights,
    dy: &[f32],
    grad_w: &mut [f32],
    grad_b: &mut [f32],
    grad_x: Option<&mut [f32]>,
) {
    dense_backward_as(mm, x, w, order, dy, grad_w, grad_b, grad_x, true);
}

/// [`dense_backward`], `grad_W` (`grad_V`) and `grad_b` accumulated if `accumulate`, else
/// overwritten: what they held before is then never read (a gradient buffer handed back
/// uncleared: the first chunk after it writes instead of adding to zeros, with the same values).
///
/// # Panics
/// On inconsistent shapes.
#[allow(clippy::too_many_arguments)]
pub fn dense_backward_as(
    mm: &mut Matmul,
    x: &[f32],
    w: &[f32],
    order: Weights,
    dy: &[f32],
    grad_w: &mut [f32],
    grad_b: &mut [f32],
    grad_x: Option<&mut [f32]>,
    accumulate: bool,
) {
    let (n, n_in, n_out) = layer_shapes(x, w, grad_b);
    assert_eq!(dy.len(), n * n_out, "dense_backward: dy is not n x n_out");
    assert_eq!(grad_w.len(), w.len(), "dense_backward: grad_w and w differ in length");
    let beta = if accumulate { 1.0 } else { 0.0 };
    match order {
        Weights::OutIn => mm.matmul(Op::T, Op::N, n_out, n_in, n, 1.0, dy, x, beta, grad_w),
        Weights::InOut => mm.matmul(Op::T, Op::N, n_in, n_out, n, 1.0, x, dy, beta, grad_w),
    }
    if !accumulate {
        grad_b.fill(0.0);
    }
    for row in dy.chunks_exact(n_out) {
        crate::dense::axpy(1.0, row, grad_b);
    }
    if let Some(gx) = grad_x {
        assert_eq!(gx.len(), x.len(), "dense_backward: grad_x and x differ in length");
        let op_w = if order == Weights::InOut { Op::T } else { Op::N };
        mm.matmul(Op::N, op_w, n, n_in, n_out, 1.0, dy, w, 0.0, gx);
    }
}

/// Shared shape checks of the GEMMs.
fn check_gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &[f32]) {
    assert_eq!(a.len(), m * k, "gemm: a is not m x k (m = {m}, k = {k})");
    assert_eq!(b.len(), k * n, "gemm: b is not k x n (k = {k}, n = {n})");
    assert_eq!(c.len(), m * n, "gemm: c is not m x n (m = {m}, n = {n})");
}

/// `C <- beta C` (`C <- 0` for `beta == 0`, without reading `C`): the product of an empty inner
/// dimension.
fn scale_c(beta: f32, c: &mut [f32]) {
    if beta == 0.0 {
        c.fill(0.0);
    } else {
        crate::dense::scale(beta, c);
    }
}

/// Summed cross-entropy of the rows of `logits` with the given per-row `xent_row` (scalar or
/// SIMD), which turns a row of logits into its gradient and returns its loss.
fn softmax_cross_entropy_with(
    xent_row: fn(&mut [f32], usize) -> f64,
    logits: &[f32],
    labels: &[u32],
    grad_logits: &mut [f32],
) -> f64 {
    let k = xent_classes(logits, labels, grad_logits);
    grad_logits.copy_from_slice(logits);
    let mut loss = 0.0;
    for (row, &y) in grad_logits.chunks_exact_mut(k.max(1)).zip(labels) {
        loss += xent_row(row, y as usize);
    }
    loss
}

/// Classes `k` of `softmax_cross_entropy`'s inputs, checking their lengths.
fn xent_classes(logits: &[f32], labels: &[u32], grad_logits: &[f32]) -> usize {
    assert_eq!(grad_logits.len(), logits.len(), "softmax_cross_entropy: grad_logits and logits differ");
    if labels.is_empty() {
        assert!(logits.is_empty(), "softmax_cross_entropy: logits without labels");
        return 0;
    }
    assert_eq!(logits.len() % labels.len(), 0, "softmax_cross_entropy: logits is not n x k");
    logits.len() / labels.len()
}

#[cfg(test)]
mod tests;
