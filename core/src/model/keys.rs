//! Key sets: which keys of a [`Layout`] a set of rows reads or an update touches, kept as a
//! bitmap and a list, and turned into coalesced parameter ranges.

use std::ops::Range;

use super::Layout;

/// A set of keys: a bitmap for membership and the members in insertion order.
#[derive(Clone, Debug)]
pub struct KeySet {
    pub(super) bits: Vec<u64>,
    pub(super) list: Vec<u32>,
    /// The radix sort's other buffer ([`radix_sort`]).
    scratch: Vec<u32>,
}

impl KeySet {
    /// An empty set over keys `0..keys`.
    pub fn new(keys: usize) -> Self {
        Self { bits: vec![0; keys.div_ceil(64)], list: Vec::new(), scratch: Vec::new() }
    }

    /// Adds `key`.
    #[inline]
    pub fn insert(&mut self, key: u32) {
        let (w, b) = ((key / 64) as usize, key % 64);
        if self.bits[w] & (1 << b) == 0 {
            self.bits[w] |= 1 << b;
            self.list.push(key);
        }
    }

    /// Adds every key of `keys`: [`insert`](Self::insert) in bulk, without a branch on whether a
    /// key is new (with features drawn from a skewed distribution, as in sparse LR, that branch
    /// is taken about half the time and mispredicts).
    pub fn extend(&mut self, keys: &[u32]) {
        self.extend_shifted(keys, 0);
    }

    /// Adds `key + shift` for every key of `keys`, as [`extend`](Self::extend) (MF's item rows
    /// follow its user rows).
    pub fn extend_shifted(&mut self, keys: &[u32], shift: u32) {
        let start = self.list.len();
        self.list.resize(start + keys.len(), 0);
        let (bits, list) = (&mut self.bits[..], &mut self.list[..]);
        let mut len = start;
        for &key in keys {
            let key = key + shift;
            let (w, b) = (&mut bits[(key / 64) as usize], 1u64 << (key % 64));
            // Written always, kept (the length moves past it) only if the key is new.
            list[len] = key;
            len += usize::from(*w & b == 0);
            *w |= b;
        }
        self.list.truncate(len);
    }

    /// The members, in insertion order (sorted after [`ranges`](Self::ranges)).
    pub fn keys(&self) -> &[u32] {
        &self.list
    }

    /// Members.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Empties the set in time proportional to its size (or to the bitmap's, when that is less).
    pub fn clear(&mut self) {
        if self.list.len() >= self.bits.len() {
            self.bits.fill(0);
        } else {
            for &k in &self.list {
                self.bits[(k / 64) as usize] = 0;
            }
        }
        self.list.clear();
    }

    /// The number of ranges [`ranges`](Self::ranges) would write (runs of consecutive members),
    /// counted off the bitmap without sorting or writing anything: a run starts at each member
    /// whose predecessor is not one. O(keys / 64).
    pub fn runs(&self) -> usize {
        let mut carry = 0u64;
        let mut n = 0;
        for &w in &self.bits {
            n += (w & !((w << 1) | carry)).count_ones() as usize;
            carry = w >> 63;
        }
        n
    }

    /// Sorts the members ascending. A list already sorted (sorted before, nothing added since)
    /// costs one pass that compares neighbours, not a second sort: a push sorts its keys to
    /// decide how to move them, then hands them on sorted.
    pub fn sort(&mut self) {
        if self.list.is_sorted() {
            return;
        }
        if self.list.len() * 16 > self.bits.len() {
            // Many keys: reading them off the bitmap in order beats sorting them (150k keys of
            // 1M: a 16k-word scan instead of an O(k log k) sort).
            self.read_bitmap();
        } else if self.list.len() >= RADIX_FROM {
            radix_sort(&mut self.list, &mut self.scratch, self.bits.len() * 64);
        } else {
            self.list.sort_unstable();
        }
    }

    /// Rewrites the list from the bitmap, in order. Each word's first four members are written
    /// whether it has them or not (the length moves by its count), so that a word costs no
    /// branch on how many it holds: a loop until the word is empty mispredicted about once a
    /// word (sparse LR's ~12k keys over a 1M-feature bitmap: 60 us a scan).
    fn read_bitmap(&mut self) {
        const FIXED: usize = 4;
        let n = self.list.len();
        self.list.resize(n + FIXED, 0);
        let list = &mut self.list[..];
        let mut len = 0;
        for (w, &word) in self.bits.iter().enumerate() {
            let (base, count) = ((w * 64) as u32, word.count_ones() as usize);
            let mut b = word;
            for j in 0..FIXED {
                // Past the word's members: a bit index of 64, overwritten by the next word's.
                list[len + j] = base.wrapping_add(b.trailing_zeros());
                b &= b.wrapping_sub(1);
            }
            let mut at = len + FIXED;
            while b != 0 {
                list[at] = base + b.trailing_zeros();
                b &= b - 1;
                at += 1;
            }
            len += count;
        }
        debug_assert_eq!(len, n, "the bitmap holds the list's members");
        self.list.truncate(len);
    }

    /// Sorts the members and writes the parameter ranges they cover into `out`, neighbouring keys
    /// coalesced.
    pub fn ranges(&mut self, layout: Layout, out: &mut Vec<Range<usize>>) {
        self.sort();
        self.coalesced(layout, out);
    }

    /// Writes the parameter ranges the members cover into `out`, in the list's order,
    /// neighbouring keys coalesced: [`ranges`](Self::ranges) of a set already sorted.
    fn coalesced(&self, layout: Layout, out: &mut Vec<Range<usize>>) {
        out.clear();
        for &k in &self.list {
            let r = layout.range(k);
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
    }
}

/// Lists of at least this many keys are sorted by [`radix_sort`], shorter ones by comparison.
/// The keys a rank's pushes touch are many and scattered over a large model (sparse LR, 2^24
/// hashed features, 2,048 rows of 20 a rank: ~40k keys, 0.1 ms an iteration in
/// `sort_unstable`); a radix sort reads and writes them a fixed number of times.
const RADIX_FROM: usize = 1024;

/// Sorts `keys`, each below `bound`, ascending: least significant digit first, in passes of at
/// most 11 bits (a histogram of 2,048 counts stays in the L1 cache), as few passes as `bound`
/// needs (2 below 2^22, 3 for any `u32`), ping-ponging with `scratch`.
fn radix_sort(keys: &mut Vec<u32>, scratch: &mut Vec<u32>, bound: usize) {
    let bits = usize::BITS - bound.saturating_sub(1).leading_zeros();
    let passes = bits.div_ceil(11).max(1);
    let width = bits.div_ceil(passes);
    let mask = (1u32 << width) - 1;
    scratch.clear();
    scratch.resize(keys.len(), 0);
    let mut histogram = [0usize; 1 << 11];
    let counts = &mut histogram[..1 << width];
    for pass in 0..passes {
        let shift = pass * width;
        counts.fill(0);
        for &k in keys.iter() {
            counts[((k >> shift) & mask) as usize] += 1;
        }
        let mut at = 0;
        for c in counts.iter_mut() {
            (*c, at) = (at, at + *c);
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & mask) as usize;
            scratch[counts[d]] = k;
            counts[d] += 1;
        }
        std::mem::swap(keys, scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_coalesce_into_ranges() {
        let l = Layout { params: 10, width: 3 };
        let mut s = KeySet::new(l.keys());
        for k in [3, 0, 1, 3] {
            s.insert(k);
        }
        let mut r = Vec::new();
        s.ranges(l, &mut r);
        assert_eq!(r, vec![0..6, 9..10]);
        s.clear();
        assert!(s.is_empty());
        s.insert(2);
        s.ranges(l, &mut r);
        assert_eq!(r, vec![6..9]);
    }

    #[test]
    fn extend_is_insert_in_bulk() {
        // Repeats within one call and across calls, word boundaries, the last key; then a clear
        // of more members than the bitmap has words (it fills the bitmap) and the set reused.
        let mut x = 7u64;
        let keys: Vec<u32> = (0..3000)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if i % 5 == 0 {
                    63 + (i % 3)
                } else {
                    ((x >> 33) % 1000) as u32
                }
            })
            .collect();
        let (mut one, mut bulk) = (KeySet::new(1000), KeySet::new(1000));
        for round in 0..2 {
            for part in keys.chunks(700) {
                part.iter().for_each(|&k| one.insert(k));
                bulk.extend(part);
                assert_eq!(bulk.keys(), one.keys(), "round {round}");
                assert_eq!(bulk.runs(), one.runs(), "round {round}");
            }
            bulk.extend(&[999, 0]);
            one.insert(999);
            one.insert(0);
            assert_eq!(bulk.keys(), one.keys());
            // Shifted: keys 0..500 land at 500..1000, repeats and all.
            bulk.extend_shifted(&[0, 499, 0, 13], 500);
            [500, 999, 500, 513].iter().for_each(|&k| one.insert(k));
            assert_eq!(bulk.keys(), one.keys());
            assert!(bulk.len() > 16, "more members than the bitmap's 16 words");
            bulk.clear();
            one.clear();
            assert!(bulk.is_empty() && bulk.runs() == 0);
        }
        bulk.extend(&[]);
        assert!(bulk.is_empty());
    }

    #[test]
    fn the_radix_sort_sorts_as_a_comparison_sort_does() {
        // Key spaces of one digit, two and three (a full u32), lists empty to long, repeats.
        let mut x = 11u64;
        for bound in [1usize, 2, 1000, 1 << 11, (1 << 11) + 1, 1 << 22, (1 << 22) + 3, 1 << 32] {
            for n in [0, 1, 5, 1023, 1024, 40_000] {
                let keys: Vec<u32> = (0..n)
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        ((x >> 16) % bound as u64) as u32
                    })
                    .collect();
                let (mut got, mut scratch) = (keys.clone(), Vec::new());
                radix_sort(&mut got, &mut scratch, bound);
                let mut want = keys;
                want.sort_unstable();
                assert_eq!(got, want, "{n} keys below {bound}");
            }
        }
        // Through the set: past the threshold, fewer than a sixteenth of the bitmap's keys.
        let l = Layout { params: 1 << 24, width: 1 };
        let mut s = KeySet::new(l.keys());
        let keys: Vec<u32> = (0..5000u32).map(|i| i.wrapping_mul(2_654_435_761) >> 8).collect();
        s.extend(&keys);
        let mut r = Vec::new();
        s.ranges(l, &mut r);
        let mut want = keys;
        want.sort_unstable();
        want.dedup();
        assert!(s.len() >= RADIX_FROM && s.len() * 16 <= s.bits.len());
        assert_eq!(s.keys(), &want[..]);
    }

    #[test]
    fn words_of_any_count_read_off_the_bitmap_in_order() {
        // Through the bitmap (more keys than a sixteenth of its words), words holding 0 to 9
        // members (the first four written whatever the count), the last bit of a word, the last
        // key; then the set reused.
        let l = Layout { params: 64 * 64, width: 1 };
        let mut s = KeySet::new(l.keys());
        for round in 0..2u32 {
            let mut want = Vec::new();
            for w in 0..64u32 {
                let count = (w * 7 + round) % 10;
                want.extend((0..count).map(|j| w * 64 + (j * 13 + w + round) % 64));
            }
            want.push(64 * 64 - 1);
            for &k in want.iter().rev() {
                s.insert(k);
            }
            want.sort_unstable();
            want.dedup();
            assert!(s.len() * 16 > s.bits.len(), "the bitmap's path");
            s.sort();
            assert_eq!(s.keys(), &want[..], "round {round}");
            let mut r = Vec::new();
            s.coalesced(l, &mut r);
            assert_eq!(r.iter().map(Range::len).sum::<usize>(), want.len());
            s.clear();
        }
    }

    #[test]
    fn many_keys_come_out_sorted_from_the_bitmap() {
        let l = Layout { params: 1000, width: 1 };
        let mut s = KeySet::new(l.keys());
        for k in (0..1000u32).rev().filter(|k| k % 3 != 0) {
            s.insert(k);
        }
        let mut r = Vec::new();
        s.ranges(l, &mut r);
        assert!(s.keys().windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s.len(), 666);
        assert_eq!(r.len(), 333);
        assert_eq!(r[0], 1..3);
        s.clear();
        assert!(s.is_empty());
        s.insert(5);
        s.ranges(l, &mut r);
        assert_eq!(r, vec![5..6]);
    }

    #[test]
    fn runs_counts_the_ranges_without_writing_them() {
        // Runs across word boundaries (63, 64, 65; 127..=129), single keys, the last key.
        for (n, keys) in [
            (200usize, vec![0u32, 1, 63, 64, 65, 100, 127, 128, 129, 199]),
            (64, vec![63]),
            (130, (0..130).collect()),
            (1000, (0..1000).filter(|k| k % 7 != 0 && k % 11 != 0).collect()),
            (10, vec![]),
        ] {
            let l = Layout { params: n * 2, width: 2 };
            let mut s = KeySet::new(l.keys());
            for &k in keys.iter().rev() {
                s.insert(k);
            }
            let runs = s.runs();
            let mut r = Vec::new();
            s.ranges(l, &mut r);
            assert_eq!(runs, r.len(), "{keys:?}");
        }
    }
}
