//! Exporting a model: its parameter vector as named [`Block`]s (tensors) and how the vector holds
//! each, and the [`Export`] trait of models that can be written out and applied to new rows.

use std::ops::Range;

use super::Model;

/// A named block of the parameter vector: one tensor of an exported model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Name (`weight`, `bias`, `layers.0.weight`, `users`, ...).
    pub name: String,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Where it lies in the parameter vector.
    pub range: Range<usize>,
    /// How the parameter vector holds the block, where not in `shape`'s row-major order.
    pub held: Held,
}

/// How the parameter vector holds a [`Block`]: the model computes with it in that order, files
/// hold it in `shape`'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// In `shape`'s row-major order.
    AsShaped,
    /// The block's transpose (a matrix of `shape` reversed).
    Transposed,
    /// Its rows (along `shape`'s first dimension) in another order: row `r` at the block's row
    /// `rows[r]`.
    Rows(Vec<u32>),
    /// A matrix's rows in groups of this many (the last one smaller), each group's transpose in
    /// turn (an MLP's first layer split by units: [`mlp::UNIT_BLOCK`](super::mlp::UNIT_BLOCK)).
    TransposedBlocks(usize),
}

impl Block {
    pub(super) fn new(name: impl Into<String>, shape: &[usize], start: usize) -> Self {
        let n: usize = shape.iter().product();
        Self { name: name.into(), shape: shape.to_vec(), range: start..start + n, held: Held::AsShaped }
    }

    /// A `rows x cols` matrix (`shape`) whose transpose the parameter vector holds at `start`.
    pub(super) fn transposed(name: impl Into<String>, shape: &[usize; 2], start: usize) -> Self {
        Self { held: Held::Transposed, ..Self::new(name, shape, start) }
    }

    /// A transposed block ([`transposed`](Self::transposed)) held instead as the transposes of
    /// its groups of `rows` rows ([`Held::TransposedBlocks`]).
    pub(super) fn in_blocks(self, rows: usize) -> Self {
        debug_assert!(self.held == Held::Transposed && rows > 0, "block {}: in blocks", self.name);
        Self { held: Held::TransposedBlocks(rows), ..self }
    }

    /// The block's rows in groups of `group` (the last one smaller): each group's values (its
    /// place in the block, in either order) and its rows.
    fn row_groups(&self, group: usize) -> impl Iterator<Item = (Range<usize>, usize)> {
        let (rows, cols) = (self.shape[0], self.row_len());
        (0..rows).step_by(group).map(move |r| {
            let end = (r + group).min(rows);
            (r * cols..end * cols, end - r)
        })
    }

    /// The block with row `r` held at row `rows[r]` (a permutation of its rows).
    pub(super) fn with_rows(self, rows: &[u32]) -> Self {
        debug_assert_eq!(rows.len(), self.shape[0], "block {}: a place per row", self.name);
        Self { held: Held::Rows(rows.to_vec()), ..self }
    }

    /// Values per row along `shape`'s first dimension.
    fn row_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// The block's values in `shape`'s row-major order, from the parameter vector `params`.
    pub fn values<'a>(&self, params: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let held = &params[self.range.clone()];
        let out = match &self.held {
            Held::AsShaped => return std::borrow::Cow::Borrowed(held),
            Held::Transposed => {
                let mut out = vec![0.0; held.len()];
                peregrine_kernels::mlp::transpose(held, self.shape[1], self.shape[0], &mut out);
                out
            }
            Held::Rows(rows) => {
                let w = self.row_len();
                let mut out = Vec::with_capacity(held.len());
                for &at in rows {
                    out.extend_from_slice(&held[at as usize * w..][..w]);
                }
                out
            }
            Held::TransposedBlocks(group) => {
                let mut out = vec![0.0; held.len()];
                for (at, rows) in self.row_groups(*group) {
                    peregrine_kernels::mlp::transpose(&held[at.clone()], self.row_len(), rows, &mut out[at]);
                }
                out
            }
        };
        std::borrow::Cow::Owned(out)
    }

    /// Writes the block's `values` (in `shape`'s row-major order) into the parameter vector.
    ///
    /// # Panics
    /// If `values` is not the block's length.
    pub fn place(&self, values: &[f32], params: &mut [f32]) {
        let held = &mut params[self.range.clone()];
        assert_eq!(
            values.len(),
            held.len(),
            "block {}: {} values for {}",
            self.name,
            values.len(),
            held.len()
        );
        match &self.held {
            Held::AsShaped => held.copy_from_slice(values),
            Held::Transposed => peregrine_kernels::mlp::transpose(values, self.shape[0], self.shape[1], held),
            Held::Rows(rows) => {
                let w = self.row_len();
                for (row, &at) in values.chunks_exact(w.max(1)).zip(rows) {
                    held[at as usize * w..][..w].copy_from_slice(row);
                }
            }
            Held::TransposedBlocks(group) => {
                for (at, rows) in self.row_groups(*group) {
                    peregrine_kernels::mlp::transpose(
                        &values[at.clone()],
                        rows,
                        self.row_len(),
                        &mut held[at],
                    );
                }
            }
        }
    }
}

/// A model that can be written out and applied to new rows.
pub trait Export: Model {
    /// The parameter vector as named blocks, in order, covering it exactly.
    fn blocks(&self) -> Vec<Block>;

    /// How the parameter vector orders its values, where that is not every block as named:
    /// checkpoints, which hold the vector as it is, record it and are refused under another
    /// (a change of order between versions). Empty: each block in its own shape's order.
    fn param_order(&self) -> &'static str {
        ""
    }

    /// Values the model uses besides its parameters (MF's global mean), to be written with them.
    fn constants(&self) -> Vec<(&'static str, Vec<f32>)> {
        Vec::new()
    }

    /// Names of the values [`predict`](Self::predict) gives per row (`probability`; `p0`,
    /// `p1`, ...; `prediction`).
    fn outputs(&self) -> Vec<String>;

    /// Appends, for evaluation rows `rows`, [`outputs`](Self::outputs) values per row under full
    /// parameters `params`: the probability of label 1 (LR), class probabilities (softmax,
    /// MLP), the predicted rating (MF).
    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>);

    /// Names of the columns [`label`](Self::label) gives, comma-separated (`label`;
    /// `user,item,rating`).
    fn label_names(&self) -> &'static str {
        "label"
    }

    /// Evaluation row `row`'s label columns as CSV text (`1`; `3`; `12,40,4.5`).
    fn label(&self, row: usize) -> String;
}
