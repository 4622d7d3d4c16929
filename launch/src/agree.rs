//! Every rank runs the same job. Under `mpirun` each process parses its own command line (MPMD
//! launches give each their own), reads its own files and may see its own directories; nothing
//! else makes them agree. So at start the ranks compare, in one collective, a digest of what
//! determines the computation: the resolved configuration key by key, the data's identity, the
//! run directory, its checkpoint, each key hashed into the slot its name picks (a key one rank
//! lacks changes its own slot alone). On a difference, a second collective gathers
//! the differing keys' values, and every rank exits with code 2, rank 0 naming each key, its
//! values and the ranks that hold them.
//!
//! The allreduce carries each key's hash and its complement under `MAX`: the maximum of the
//! complements is the complement of the minimum, so one collective of fixed size gives every
//! key's minimum and maximum over the ranks, whatever their count.

use peregrine_transport::{ReduceOp, Transport};

use crate::error::AppError;

/// Slots of the digest: each key goes to the slot its name hashes to (the allreduce's size is
/// fixed, and a key only some ranks have, an option one rank set, changes its own slot alone).
pub const SLOTS: usize = 256;

/// Bytes of a value gathered to name it in the message.
const VALUE_BYTES: usize = 64;

/// Differing keys whose values are gathered and named (the others are counted).
const NAMED: usize = 6;

/// What this rank would run: `(key, value)` in words, in an order every rank shares.
pub type Digest = Vec<(String, String)>;

/// Collective: checks that every rank holds the same `digest`. `local` is this rank's error found
/// while making it (a dataset that does not open): it travels in the same collective, so that no
/// rank waits for a peer that has given up.
pub fn agree(t: &Transport, digest: Result<Digest, AppError>) -> Result<(), AppError> {
    let (rank, world) = (t.rank(), t.world_size());
    let hashes = match &digest {
        Ok(d) => slots(d),
        Err(_) => vec![0; SLOTS],
    };
    // Each key's hash and its complement, then rank + 1 of a rank that failed (the largest).
    let mut words = vec![0u64; 2 * SLOTS + 1];
    for (i, &h) in hashes.iter().enumerate() {
        words[i] = h;
        words[SLOTS + i] = !h;
    }
    words[2 * SLOTS] = if digest.is_err() { rank as u64 + 1 } else { 0 };
    t.allreduce(&mut words, ReduceOp::Max)?;
    let digest = match digest {
        Err(e) => return Err(AppError::Agreed(Box::new(e))),
        Ok(d) => d,
    };
    if let Some(r) = words[2 * SLOTS].checked_sub(1) {
        return Err(AppError::Elsewhere {
            rank: r as usize,
            what: format!("rank {r} could not start the job"),
        });
    }
    let differ: Vec<usize> = (0..SLOTS).filter(|&i| words[i] != !words[SLOTS + i]).collect();
    if differ.is_empty() {
        return Ok(());
    }
    // The rare path: gather every rank's hash and value of the first differing keys (one Sum
    // allreduce in which each rank fills its own row).
    let named = &differ[..differ.len().min(NAMED)];
    let row = named.len() * (1 + VALUE_BYTES / 8);
    let mut table = vec![0u64; row * world];
    for (j, &i) in named.iter().enumerate() {
        let at = rank * row + j * (1 + VALUE_BYTES / 8);
        table[at] = hashes[i];
        let value = slot_value(&digest, i);
        let bytes = value.as_bytes();
        for (w, chunk) in table[at + 1..at + 1 + VALUE_BYTES / 8].iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
    }
    t.allreduce(&mut table, ReduceOp::Sum)?;
    if rank != 0 {
        return Err(AppError::Agreed(Box::new(AppError::Usage(
            "the ranks do not run the same job (rank 0 names the differences)".into(),
        ))));
    }
    let mut lines = Vec::new();
    for (j, &i) in named.iter().enumerate() {
        let keys: Vec<&str> = slot_keys(&digest, i).iter().map(|(k, _)| k.as_str()).collect();
        let name = if keys.is_empty() { "(a key rank 0 does not have)".to_owned() } else { keys.join(", ") };
        // The values in order of the lowest rank holding each.
        let mut groups: Vec<(u64, String, Vec<usize>)> = Vec::new();
        for r in 0..world {
            let at = r * row + j * (1 + VALUE_BYTES / 8);
            match groups.iter_mut().find(|g| g.0 == table[at]) {
                Some(g) => g.2.push(r),
                None => groups.push((table[at], value_of(&table[at + 1..at + 1 + VALUE_BYTES / 8]), vec![r])),
            }
        }
        let held: Vec<String> =
            groups.iter().map(|(_, v, ranks)| format!("{v} on {}", ranks_text(ranks))).collect();
        lines.push(format!("  {name}: {}", held.join("; ")));
    }
    if differ.len() > named.len() {
        lines.push(format!("  and {} more keys", differ.len() - named.len()));
    }
    Err(AppError::Agreed(Box::new(AppError::Usage(format!(
        "the ranks do not run the same job (each process of an MPI launch reads its own command line and \
         files; give every rank the same):\n{}",
        lines.join("\n")
    )))))
}

/// The slot of key `name`.
fn slot_of(name: &str) -> usize {
    (fnv1a(0, name.as_bytes()) % SLOTS as u64) as usize
}

/// Each slot's hash of its keys' names and values.
fn slots(digest: &Digest) -> Vec<u64> {
    let mut out = vec![0u64; SLOTS];
    for (k, v) in digest {
        let slot = &mut out[slot_of(k)];
        *slot = fnv1a(*slot ^ fnv1a(0, k.as_bytes()), v.as_bytes());
    }
    out
}

/// The keys of slot `i`.
fn slot_keys(digest: &Digest, i: usize) -> Vec<&(String, String)> {
    digest.iter().filter(|(k, _)| slot_of(k) == i).collect()
}

/// The value of slot `i` in words: its key's value, or `key=value, ...` of several (none: empty).
fn slot_value(digest: &Digest, i: usize) -> String {
    match slot_keys(digest, i).as_slice() {
        [(_, v)] => v.clone(),
        many => many.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "),
    }
}

/// FNV-1a, 64 bits, continuing from `seed` (stable across builds and machines, unlike std's
/// hasher).
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A value gathered as words, cut at [`VALUE_BYTES`] (marked) and at a character boundary.
fn value_of(words: &[u64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let text = text.trim_end_matches('\u{fffd}').to_owned();
    if end == 0 {
        "unset".into()
    } else if end == bytes.len() {
        format!("`{text}...`")
    } else {
        format!("`{text}`")
    }
}

/// `rank 3`, or `ranks 0, 2-5, 7`.
pub fn ranks_text(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", ranks[i], ranks[j]) } else { ranks[i].to_string() });
        i = j + 1;
    }
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_transport::run_local;

    fn digest(pairs: &[(&str, &str)]) -> Digest {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn ranks_are_named_in_runs() {
        assert_eq!(ranks_text(&[3]), "rank 3");
        assert_eq!(ranks_text(&[0, 2, 3, 4, 5, 7]), "ranks 0, 2-5, 7");
        assert_eq!(ranks_text(&[0, 1]), "ranks 0-1");
    }

    #[test]
    fn a_value_is_named_whole_or_cut() {
        let words = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            b.resize(VALUE_BYTES, 0);
            b.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect::<Vec<_>>()
        };
        assert_eq!(value_of(&words("0.1")), "`0.1`");
        let long = "x".repeat(VALUE_BYTES);
        assert_eq!(value_of(&words(&long)), format!("`{long}...`"));
    }

    #[test]
    fn the_same_job_passes_and_a_difference_names_key_values_and_ranks() {
        let same = run_local(4, |t| agree(&t, Ok(digest(&[("lr", "0.1"), ("seed", "1")])))).expect("world");
        assert!(same.iter().all(Result::is_ok), "{same:?}");

        let out = run_local(4, |t| {
            let lr = if t.rank() == 2 { "0.2" } else { "0.1" };
            let seed = if t.rank() >= 2 { "7" } else { "1" };
            agree(&t, Ok(digest(&[("lr", lr), ("batch", "128"), ("seed", seed)])))
        })
        .expect("world");
        let message = out[0].as_ref().expect_err("rank 0 refuses").to_string();
        assert!(message.contains("lr: `0.1` on ranks 0-1, 3; `0.2` on rank 2"), "{message}");
        assert!(message.contains("seed: `1` on ranks 0-1; `7` on ranks 2-3"), "{message}");
        assert!(!message.contains("batch"), "{message}");
        for r in &out[1..] {
            assert!(matches!(r, Err(AppError::Agreed(e)) if matches!(**e, AppError::Usage(_))), "{r:?}");
        }
    }

    #[test]
    fn a_key_only_one_rank_has_is_named_alone() {
        let out = run_local(2, |t| {
            let mut d = digest(&[("lr", "0.1"), ("seed", "1"), ("batch", "128")]);
            if t.rank() == 1 {
                d.insert(1, ("early-stop".into(), "3".into()));
            }
            agree(&t, Ok(d))
        })
        .expect("world");
        let message = out[0].as_ref().expect_err("rank 0 refuses").to_string();
        assert_eq!(message.lines().count(), 2, "{message}");
        assert!(
            message.contains("(a key rank 0 does not have): unset on rank 0; `3` on rank 1"),
            "{message}"
        );
    }

    #[test]
    fn a_rank_that_cannot_make_its_digest_is_named_by_the_others() {
        let out = run_local(3, |t| {
            let d = if t.rank() == 1 {
                Err(AppError::Usage("no data".into()))
            } else {
                Ok(digest(&[("a", "b")]))
            };
            agree(&t, d)
        })
        .expect("world");
        assert!(matches!(&out[1], Err(AppError::Agreed(e)) if e.to_string() == "no data"), "{:?}", out[1]);
        for r in [&out[0], &out[2]] {
            assert!(matches!(r, Err(AppError::Elsewhere { rank: 1, .. })), "{r:?}");
        }
    }
}
