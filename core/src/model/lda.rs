//! Latent Dirichlet allocation by collapsed Gibbs sampling (Griffiths and Steyvers 2004), the
//! third workload of the FlexPS straggler study: updates are sparse integer counts, not
//! gradients.
//!
//! Data: a sparse dataset of word counts (one row per document, one column per vocabulary word;
//! `peregrine data convert docword|ldac`). Every state of the sampler lives in the parameter
//! window, as `f32` holding whole numbers (exact below 2^24), one key of `K` values at a time:
//! 1. `word_topic`: `n_wk`, `V x K`, one key per word;
//! 2. `topic`: `n_k`, one key;
//! 3. `doc_topic`: `n_dk`, `D x K`, one key per document;
//! 4. `z`: the topic of every token (a word counted `c` times in a document is `c` tokens), each
//!    document's tokens starting on a key of their own.
//!
//! The issue that asked for LDA put the document-topic counts in each rank's memory. They are in
//! the window here, with the assignments, for the same reason as matrix factorization's user rows:
//! a chunk of documents may run on any rank (taken over, copied by speculation), and the rank that
//! runs it must see, and leave, the state its documents were in. A document's counts are read
//! and written only by the chunk holding the document, once per epoch.
//!
//! A chunk copies the keys its documents touch from the iteration's snapshot ([`Copies`], as MF),
//! resamples each token in order from
//! `p(z = k) ~ (n_dk + alpha) (n_wk + eta) / (n_k + V eta)` (the token's own count taken out
//! first), and its update is what it changed: integer deltas, added to the window by
//! accumulate. Tokens of one iteration's other chunks see the snapshot's counts (AD-LDA,
//! Newman et al. 2009): the approximation every distributed LDA makes. Counts read below zero
//! (stale reads under asynchronous schemes) count as zero.
//!
//! Sampling: the `K` unnormalised probabilities in one pass (SIMD-friendly: three loads, a
//! product, a running sum), then one uniform draw and a binary search of the prefix sums.
//! Random numbers come from a hash of the token, the document's counts and the snapshot's
//! topic totals: the same snapshot gives the same draws on any rank or thread.
//!
//! The evaluation is the joint log-likelihood `log p(w, z)` of the training corpus (the
//! quantity the `lda` package reports), per token as the loss; the metric is
//! `exp(-log p(w, z) / tokens)`. There is no held-out evaluation (it needs inference on new
//! documents): an evaluation set is refused.

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Kind, SparseRows};

use super::{
    Baseline, Block, Built, Copies, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

/// LDA over a corpus of word counts.
#[derive(Debug)]
pub struct Lda {
    data: Sets,
    topics: usize,
    alpha: f64,
    eta: f64,
    vocab: usize,
    docs: usize,
    /// Each document's first `z` key (relative to the `z` block), `docs + 1` entries.
    z_keys: Vec<u64>,
    /// Each document's tokens.
    tokens: Vec<u32>,
    total_tokens: u64,
}

/// Per-thread copies of the keys a chunk touches and what the chunk changed, and the topics'
/// unnormalised probabilities (prefix sums).
#[derive(Debug)]
pub struct Work {
    copies: Copies,
    p: Vec<f64>,
}

impl Lda {
    /// LDA with `topics` topics and symmetric priors `alpha` (document-topic) and `eta`
    /// (topic-word) on the word counts in `train`.
    pub fn new(train: &Path, eval: Option<&Path>, topics: usize, alpha: f64, eta: f64) -> Built<Self> {
        if let Some(e) = eval {
            return Err(ModelError::Unfit(format!(
                "--eval {}: LDA is evaluated on its training corpus (the joint log-likelihood); held-out \
                 documents would need inference, which is not implemented",
                e.display()
            )));
        }
        let data = Sets::open(train, None, Kind::Sparse)?;
        if topics < 2 {
            return Err(ModelError::Unfit(format!("LDA needs at least 2 topics, got {topics}")));
        }
        if !(alpha.is_finite() && alpha > 0.0 && eta.is_finite() && eta > 0.0) {
            return Err(ModelError::Unfit(format!(
                "LDA's priors must be positive: alpha {alpha}, eta {eta}"
            )));
        }
        let x = data.train.sparse().expect("kind checked");
        let mut tokens = Vec::with_capacity(x.len());
        let mut z_keys = Vec::with_capacity(x.len() + 1);
        z_keys.push(0u64);
        for d in 0..x.len() {
            let r = x.rows(d..d + 1);
            let mut n = 0u64;
            for (&c, &w) in r.values.iter().zip(r.indices) {
                if !(c >= 1.0 && c.fract() == 0.0 && c < 16_777_216.0) {
                    return Err(ModelError::Unfit(format!(
                        "{}: document {d} (row {}), word {w}: count {c} is not a whole number from 1 to 2^24 \
                         (LDA needs word counts; convert with `peregrine data convert docword|ldac`)",
                        data.train.path().display(),
                        d + 1
                    )));
                }
                n += c as u64;
            }
            if n >= 1 << 24 {
                return Err(ModelError::Unfit(format!(
                    "{}: document {d} has {n} tokens: at most 2^24 - 1 (counts are exact f32 integers)",
                    data.train.path().display()
                )));
            }
            tokens.push(n as u32);
            z_keys.push(z_keys[d] + n.div_ceil(topics as u64));
        }
        let total_tokens: u64 = tokens.iter().map(|&n| u64::from(n)).sum();
        if total_tokens >= 1 << 24 {
            return Err(ModelError::Unfit(format!(
                "{}: {total_tokens} tokens: a topic's count could pass 2^24, beyond the whole numbers an f32 \
                 window holds exactly (a corpus of at most 16,777,215 tokens)",
                data.train.path().display()
            )));
        }
        Ok(Self { vocab: x.cols, docs: x.len(), data, topics, alpha, eta, z_keys, tokens, total_tokens })
    }

    fn rows_of(&self) -> SparseRows<'_> {
        self.data.train.sparse().expect("the kind is checked when the model is built")
    }

    /// First key of each block: word_topic, topic, doc_topic, z.
    fn word_key(&self, w: u32) -> usize {
        w as usize
    }
    fn topic_key(&self) -> usize {
        self.vocab
    }
    fn doc_key(&self, d: usize) -> usize {
        self.vocab + 1 + d
    }
    fn z_key(&self, d: usize) -> usize {
        self.vocab + 1 + self.docs + self.z_keys[d] as usize
    }

    /// The initial state: every token's topic drawn uniformly from `(seed, document, token)`, the
    /// counts those topics make.
    fn initial(&self, seed: u64) -> Vec<f32> {
        let k = self.topics;
        let mut v = vec![0.0f32; self.layout().params];
        let x = self.rows_of();
        for d in 0..self.docs {
            for (t, w) in doc_tokens(x, d) {
                let h = crate::plan::mix(seed ^ crate::plan::mix(((d as u64) << 32) | t as u64));
                let topic = (h % k as u64) as usize;
                v[self.z_key(d) * k + t] = topic as f32;
                v[self.word_key(w) * k + topic] += 1.0;
                v[self.topic_key() * k + topic] += 1.0;
                v[self.doc_key(d) * k + topic] += 1.0;
            }
        }
        v
    }

    /// Resamples document `d` of `x` (its tokens) in `local` (which holds the keys the document
    /// reads). Returns the document's mean `-ln p(w | d)` per token under the counts each token
    /// was drawn from.
    fn sample_doc(&self, x: SparseRows<'_>, d: usize, local: &mut [f32], p: &mut [f64]) -> f64 {
        let k = self.topics;
        let (alpha, eta, v_eta) = (self.alpha, self.eta, self.vocab as f64 * self.eta);
        let nd = f64::from(self.tokens[d]);
        let (doc, zk, topic) = (self.doc_key(d) * k, self.z_key(d) * k, self.topic_key() * k);
        // Random stream of this document under this snapshot.
        let mut h = crate::plan::mix(d as u64);
        for &v in &local[topic..topic + k] {
            h = crate::plan::mix(h ^ u64::from(v.to_bits()));
        }
        for &v in &local[doc..doc + k] {
            h = crate::plan::mix(h ^ u64::from(v.to_bits()));
        }
        let mut nll = 0.0;
        for (t, w) in doc_tokens(x, d) {
            let word = self.word_key(w) * k;
            let old = (local[zk + t] as usize).min(k - 1);
            local[doc + old] -= 1.0;
            local[word + old] -= 1.0;
            local[topic + old] -= 1.0;
            let mut sum = 0.0;
            for j in 0..k {
                let a = f64::from(local[doc + j].max(0.0)) + alpha;
                let b = f64::from(local[word + j].max(0.0)) + eta;
                let n = f64::from(local[topic + j].max(0.0)) + v_eta;
                sum += a * b / n;
                p[j] = sum;
            }
            nll -= (sum / (nd - 1.0 + k as f64 * alpha)).ln();
            h = crate::plan::mix(h ^ t as u64);
            let u = (h >> 11) as f64 / (1u64 << 53) as f64 * sum;
            let new = p[..k].partition_point(|&s| s <= u).min(k - 1);
            local[doc + new] += 1.0;
            local[word + new] += 1.0;
            local[topic + new] += 1.0;
            local[zk + t] = new as f32;
        }
        nll / nd.max(1.0)
    }
}

/// Document `d`'s tokens in order (a word counted `c` times is `c` tokens): `(token index within
/// the document, word)`.
fn doc_tokens<'a>(x: SparseRows<'a>, d: usize) -> impl Iterator<Item = (usize, u32)> + 'a {
    let r = x.rows(d..d + 1);
    r.values.iter().zip(r.indices).flat_map(|(&c, &w)| std::iter::repeat_n(w, c as usize)).enumerate()
}

/// `ln Gamma(x)` for `x > 0` (Lanczos, g = 7, 9 terms; relative error below 1e-13).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Gamma(x) Gamma(1 - x) = pi / sin(pi x).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, &g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

impl Model for Lda {
    type Work = Work;

    fn name(&self) -> &'static str {
        "lda"
    }

    fn layout(&self) -> Layout {
        let keys = self.vocab + 1 + self.docs + self.z_keys[self.docs] as usize;
        Layout { params: keys * self.topics, width: self.topics }
    }

    fn rows(&self) -> usize {
        self.docs
    }

    fn eval_rows(&self) -> usize {
        self.docs
    }

    fn metric(&self) -> Metric {
        Metric::Perplexity
    }

    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]) {
        out.copy_from_slice(&self.initial(seed)[range]);
    }

    fn sparse(&self) -> bool {
        true
    }

    fn keys(&self, rows: Range<usize>, set: &mut KeySet) {
        let x = self.rows_of();
        set.insert(self.topic_key() as u32);
        for d in rows {
            for &w in x.rows(d..d + 1).indices {
                set.insert(self.word_key(w) as u32);
            }
            set.insert(self.doc_key(d) as u32);
            for key in self.z_key(d)..self.z_key(d + 1) {
                set.insert(key as u32);
            }
        }
    }

    fn work(&self, _chunk: usize) -> Work {
        Work { copies: Copies::new(self.layout()), p: vec![0.0; self.topics] }
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Work) -> f64 {
        let l = self.layout();
        let local = work.copies.take(l, params, |set| self.keys(rows.clone(), set));
        let x = self.rows_of();
        let mut loss = 0.0;
        for d in rows {
            loss += self.sample_doc(x, d, local, &mut work.p);
        }
        work.copies.settle(l, Some(params));
        loss
    }

    fn drain(&self, work: &mut Work, scale: f32, delta: &mut Delta) {
        work.copies.drain(self.layout(), scale, delta);
    }

    fn scale(&self, _rows: usize) -> f32 {
        1.0
    }

    fn lr(&self) -> Option<f32> {
        None
    }

    fn needs_current_rows(&self) -> bool {
        true
    }

    /// A model that learned nothing: every word and every topic equally likely, `ln V + ln K`
    /// per token of `-log p(w, z)`; perplexity `V K`.
    fn baseline(&self) -> Baseline {
        let vk = (self.vocab.max(1) * self.topics) as f64;
        Baseline { blind_loss: vk.ln(), constant_metric: vk }
    }

    /// `[-log p(w, z) of the documents, the same, tokens]`; the topic-word part of
    /// `log p(w, z)` is added by the range starting at document 0.
    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums {
        let k = self.topics;
        let (alpha, eta) = (self.alpha, self.eta);
        let count = |v: f32| f64::from(v.max(0.0).round());
        let mut ll = 0.0;
        if rows.start == 0 {
            let (lg_eta, v_eta) = (ln_gamma(eta), self.vocab as f64 * eta);
            ll += k as f64 * ln_gamma(v_eta);
            let topic = &params[self.topic_key() * k..][..k];
            for &n in topic {
                ll -= ln_gamma(v_eta + count(n));
            }
            for &n in &params[..self.vocab * k] {
                if n >= 0.5 {
                    ll += ln_gamma(eta + count(n)) - lg_eta;
                }
            }
        }
        let (lg_alpha, k_alpha) = (ln_gamma(alpha), k as f64 * alpha);
        let mut tokens = 0.0;
        for d in rows {
            let nd = f64::from(self.tokens[d]);
            tokens += nd;
            ll += ln_gamma(k_alpha) - ln_gamma(k_alpha + nd);
            for &n in &params[self.doc_key(d) * k..][..k] {
                if n >= 0.5 {
                    ll += ln_gamma(alpha + count(n)) - lg_alpha;
                }
            }
        }
        [-ll, -ll, tokens]
    }
}

impl Export for Lda {
    fn blocks(&self) -> Vec<Block> {
        let k = self.topics;
        let z = self.z_keys[self.docs] as usize;
        vec![
            Block::new("word_topic", &[self.vocab, k], 0),
            Block::new("topic", &[k], self.topic_key() * k),
            Block::new("doc_topic", &[self.docs, k], self.doc_key(0) * k),
            Block::new("z", &[z, k], self.z_key(0) * k),
        ]
    }

    fn outputs(&self) -> Vec<String> {
        (0..self.topics).map(|k| format!("topic{k}")).collect()
    }

    /// Each document's topic proportions, `(n_dk + alpha) / (n_d + K alpha)`.
    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>) {
        let k = self.topics;
        for d in rows {
            let nd = f64::from(self.tokens[d]) + k as f64 * self.alpha;
            for &n in &params[self.doc_key(d) * k..][..k] {
                out.push(((f64::from(n.max(0.0)) + self.alpha) / nd) as f32);
            }
        }
    }

    fn label_names(&self) -> &'static str {
        "document"
    }

    fn label(&self, row: usize) -> String {
        row.to_string()
    }
}

impl Lda {
    /// Tokens in the corpus.
    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// Topics.
    pub fn topics(&self) -> usize {
        self.topics
    }

    /// Checks that a state is a consistent sampler state: every token's topic a whole number
    /// below `K`, and the three count tables exactly the counts of those topics (per word and
    /// topic, per topic, per document and topic). What an update applied twice, or lost, breaks.
    pub fn check_counts(&self, params: &[f32]) -> Result<(), String> {
        let k = self.topics;
        let x = self.rows_of();
        let mut word = vec![0u32; self.vocab * k];
        let mut topic = vec![0u32; k];
        for d in 0..self.docs {
            let mut doc = vec![0u32; k];
            for (t, w) in doc_tokens(x, d) {
                let z = params[self.z_key(d) * k + t];
                if !(z >= 0.0 && z.fract() == 0.0 && (z as usize) < k) {
                    return Err(format!("document {d}, token {t}: topic {z}"));
                }
                let z = z as usize;
                doc[z] += 1;
                word[w as usize * k + z] += 1;
                topic[z] += 1;
            }
            let held = &params[self.doc_key(d) * k..][..k];
            if held.iter().zip(&doc).any(|(&h, &c)| h != c as f32) {
                return Err(format!("document {d}: counts {held:?}, its tokens' topics give {doc:?}"));
            }
        }
        if let Some(i) = (0..self.vocab * k).find(|&i| params[i] != word[i] as f32) {
            return Err(format!(
                "word {}, topic {}: count {}, the tokens' topics give {}",
                i / k,
                i % k,
                params[i],
                word[i]
            ));
        }
        let held = &params[self.topic_key() * k..][..k];
        if held.iter().zip(&topic).any(|(&h, &c)| h != c as f32) {
            return Err(format!("topic totals {held:?}, the tokens' topics give {topic:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_state_is_consistent_and_a_computed_chunk_keeps_it_so() {
        let dir = tempfile::tempdir().expect("tmp");
        let (text, pgd) = (dir.path().join("c.ldac"), dir.path().join("c.pgd"));
        std::fs::write(&text, "3 0:2 3:1 5:4\n2 1:3 2:1\n4 0:1 2:2 4:1 5:1\n").expect("write");
        peregrine_kernels::data::bow::convert(&text, &pgd, peregrine_kernels::data::bow::Format::Ldac, None)
            .expect("convert");
        let m = Lda::new(&pgd, None, 3, 0.1, 0.01).expect("model");
        assert_eq!(m.total_tokens(), 16);
        let l = m.layout();
        // 6 words, the totals, 3 documents, then z: 7, 4 and 5 tokens in keys of 3.
        assert_eq!(l.params, (6 + 1 + 3 + 3 + 2 + 2) * 3);
        let mut params = vec![0.0; l.params];
        m.init(7, 0..l.params, &mut params);
        m.check_counts(&params).expect("initial state");
        // One chunk of two documents computed, its update applied: still consistent.
        let mut work = m.work(2);
        let loss = m.compute(0..2, &params, &mut work);
        assert!(loss.is_finite() && loss > 0.0);
        let mut delta = Delta::new(l);
        m.drain(&mut work, m.scale(2), &mut delta);
        for (p, d) in params.iter_mut().zip(delta.values()) {
            *p += d;
        }
        m.check_counts(&params).expect("after a chunk");
        // Applied twice, it is not.
        for (p, d) in params.iter_mut().zip(delta.values()) {
            *p += d;
        }
        assert!(delta.values().iter().any(|&d| d != 0.0), "the chunk moved some token");
        assert!(m.check_counts(&params).is_err());
        // The joint log-likelihood of the whole corpus is the sum over document ranges.
        let mut fresh = vec![0.0; l.params];
        m.init(7, 0..l.params, &mut fresh);
        let whole = m.evaluate(&fresh, 0..3);
        let (a, b) = (m.evaluate(&fresh, 0..1), m.evaluate(&fresh, 1..3));
        assert!((whole[0] - a[0] - b[0]).abs() < 1e-9 * whole[0].abs());
        assert_eq!(whole[2], 16.0);
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        for (x, want) in [
            (1.0, 0.0),
            (2.0, 0.0),
            (0.5, 0.5 * std::f64::consts::PI.ln()),
            (10.0, 362_880f64.ln()),
            (0.01, 4.599_479_878_042_022),
            (1e4, 82_099.717_496_442_38),
        ] {
            let got = ln_gamma(x);
            assert!((got - want).abs() <= 1e-10 * want.abs().max(1.0), "ln_gamma({x}) = {got}, want {want}");
        }
    }
}
