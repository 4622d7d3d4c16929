//! The event queue of the simulator: events in virtual time (integer nanoseconds, so that sums of
//! costs are exact), earliest first, events at the same time in the order they were scheduled.
//!
//! A simulation of 4,096 ranks of 16 threads keeps ~65,000 events scheduled (one per busy
//! thread) and pops one per chunk, so the queue is most of its time. It has two levels: each
//! group of events (a rank's: [`Grouped`]) in a small heap of its own, and the groups in a
//! 4-ary heap by their earliest event. A pop sifts through a heap of ~4,000 groups (six levels,
//! ~100 KB that stay in cache) and one of ~16 events, where one heap of every event (1 MB at
//! 65,000 16-byte entries, the events in a slab beside it) missed the cache at most of its eight
//! levels and at the slab: 40 % of a simulation's time was that heap's `pop`. The order is the
//! same: by time, then scheduling order.

/// Virtual time in nanoseconds.
pub type Nanos = u64;

/// Children per node of the heap of groups.
const ARITY: usize = 4;
/// A group's position in the heap of groups when it has no event scheduled.
const ABSENT: u32 = u32::MAX;

/// An event's group: events of one group share a heap (a simulation's: the rank's). Any
/// grouping gives the same order; one whose groups hold few events each at a time is fastest.
pub trait Grouped {
    /// The event's group, a small index (the queue keeps a heap per index up to the largest).
    fn group(&self) -> usize;
}

/// When an event is due: by time, then by sequence number (scheduling order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: Nanos,
    seq: u64,
}

/// A group in the heap of groups: when its earliest event is due.
#[derive(Clone, Copy, Debug)]
struct Top {
    first: Due,
    group: u32,
}

/// Events of type `E`, earliest first; ties in scheduling order.
#[derive(Debug)]
pub struct EventQueue<E> {
    /// Per group, a binary min-heap of its events (held in the heap: an event read from a slab
    /// beside it missed the cache as often as the heap of every event had).
    groups: Vec<Vec<(Due, E)>>,
    /// The groups with events, a 4-ary min-heap by their earliest event.
    tops: Vec<Top>,
    /// Per group, its index in `tops` ([`ABSENT`]: none).
    pos: Vec<u32>,
    seq: u64,
    now: Nanos,
    popped: u64,
    len: usize,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self { groups: Vec::new(), tops: Vec::new(), pos: Vec::new(), seq: 0, now: 0, popped: 0, len: 0 }
    }
}

impl<E: Grouped + Copy> EventQueue<E> {
    /// Schedules `event` at `at` (not before now: an event in the past runs now).
    pub fn push(&mut self, at: Nanos, event: impl Into<E>) {
        let event = event.into();
        let g = event.group();
        assert!(g < ABSENT as usize, "an event group past 2^32 - 1");
        // A simulation holds about one event per thread; far more is a storm of events (a bug).
        assert!(self.len < 1 << 26, "more than 2^26 events scheduled at once");
        self.seq += 1;
        let due = Due { at: at.max(self.now), seq: self.seq };
        if g >= self.groups.len() {
            self.groups.resize_with(g + 1, Vec::new);
            self.pos.resize(g + 1, ABSENT);
        }
        let heap = &mut self.groups[g];
        // Sift up in the group's heap.
        let mut i = heap.len();
        heap.push((due, event));
        while i > 0 {
            let parent = (i - 1) / 2;
            if heap[parent].0 <= due {
                break;
            }
            heap[i] = heap[parent];
            i = parent;
        }
        heap[i] = (due, event);
        self.len += 1;
        if i > 0 {
            return;
        }
        // The group's earliest event is new: the group moves up among the groups (or joins).
        let at = match self.pos[g] {
            ABSENT => {
                self.tops.push(Top { first: due, group: g as u32 });
                self.tops.len() - 1
            }
            p => {
                self.tops[p as usize].first = due;
                p as usize
            }
        };
        self.sift_up(at);
    }

    /// The next event and its time, which becomes the current time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let top = *self.tops.first()?;
        let g = top.group as usize;
        let heap = &mut self.groups[g];
        let (due, event) = heap[0];
        let last = heap.pop().expect("a group among the tops has an event");
        if heap.is_empty() {
            // The group has no event left: it leaves the tops.
            self.pos[g] = ABSENT;
            let moved = self.tops.pop().expect("the tops have a first");
            if !self.tops.is_empty() {
                self.tops[0] = moved;
                self.sift_down(0);
            }
        } else {
            // Sift the group's last event down from its root.
            let n = heap.len();
            let mut i = 0;
            loop {
                let l = 2 * i + 1;
                if l >= n {
                    break;
                }
                let c = if l + 1 < n && heap[l + 1].0 < heap[l].0 { l + 1 } else { l };
                if last.0 <= heap[c].0 {
                    break;
                }
                heap[i] = heap[c];
                i = c;
            }
            heap[i] = last;
            self.tops[0].first = heap[0].0;
            self.sift_down(0);
        }
        self.now = due.at;
        self.popped += 1;
        self.len -= 1;
        Some((due.at, event))
    }

    /// Moves the group at `i` of the tops up to its place.
    fn sift_up(&mut self, mut i: usize) {
        let t = self.tops[i];
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.tops[parent].first <= t.first {
                break;
            }
            self.put(i, self.tops[parent]);
            i = parent;
        }
        self.put(i, t);
    }

    /// Puts `t` at `i` of the tops, where its group's position says it is.
    fn put(&mut self, i: usize, t: Top) {
        self.tops[i] = t;
        self.pos[t.group as usize] = i as u32;
    }

    /// Moves the group at `i` of the tops down to its place.
    fn sift_down(&mut self, mut i: usize) {
        let t = self.tops[i];
        let n = self.tops.len();
        loop {
            let first = i * ARITY + 1;
            if first >= n {
                break;
            }
            let end = (first + ARITY).min(n);
            let mut min = first;
            for c in first + 1..end {
                if self.tops[c].first < self.tops[min].first {
                    min = c;
                }
            }
            if t.first <= self.tops[min].first {
                break;
            }
            self.put(i, self.tops[min]);
            i = min;
        }
        self.put(i, t);
    }
}

impl<E> EventQueue<E> {
    /// The current time: that of the last event popped.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Events scheduled and not yet popped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no event is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Groups for the tests' events: any grouping must give the same order.
    impl Grouped for &str {
        fn group(&self) -> usize {
            self.len()
        }
    }

    impl Grouped for i32 {
        fn group(&self) -> usize {
            self.unsigned_abs() as usize % 2
        }
    }

    impl Grouped for u64 {
        fn group(&self) -> usize {
            (crate::plan::mix(*self) % 61) as usize
        }
    }

    #[test]
    fn events_come_out_by_time_then_in_scheduling_order() {
        let mut q = EventQueue::default();
        q.push(30, "c");
        q.push(10, "a1");
        q.push(20, "b");
        q.push(10, "a2");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, [(10, "a1"), (10, "a2"), (20, "b"), (30, "c")]);
        assert_eq!(q.now(), 30);
        assert_eq!(q.popped(), 4);
        assert!(q.is_empty());
    }

    #[test]
    fn time_never_runs_backwards() {
        let mut q = EventQueue::default();
        q.push(100, 1);
        assert_eq!(q.pop(), Some((100, 1)));
        // Scheduled in the past: runs now, after what is already due now.
        q.push(100, 2);
        q.push(50, 3);
        assert_eq!(q.pop(), Some((100, 2)));
        assert_eq!(q.pop(), Some((100, 3)));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn many_events_come_out_as_a_sort_by_time_then_order_would_give() {
        // Pushes and pops interleaved (as a simulation does), times drawn with many ties.
        let mut q = EventQueue::default();
        let mut want = Vec::new();
        let mut got = Vec::new();
        let mut x = 12345u64;
        for i in 0..20_000u64 {
            x = crate::plan::mix(x);
            let at = q.now() + x % 50;
            q.push(at, i);
            want.push((at, i));
            if x.is_multiple_of(3) {
                got.extend(q.pop());
            }
        }
        got.extend(std::iter::from_fn(|| q.pop()));
        want.sort();
        // Popped in time order overall, ties in push order: the same as sorting, as long as
        // nothing was pushed before the time already popped (every push is at or after now).
        assert_eq!(got, want);
    }
}
