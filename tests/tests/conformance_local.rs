//! The conformance suite over the `local` backend: ranks as threads, for several world sizes.

use peregrine_transport::conformance::{Params, CASES};
use peregrine_transport::run_local;

fn run_case(name: &str, ranks: usize) {
    let case = CASES.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name}"));
    let params = Params::default();
    let outcomes = run_local(ranks, |t| (case.run)(&t, &params).map_err(|e| e.to_string())).expect("world");
    if let Some(e) = outcomes.into_iter().find_map(Result::err) {
        panic!("{name} on {ranks} ranks: {e}");
    }
}

macro_rules! cases {
    ($($fn:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $fn() {
                for ranks in [1, 2, 3, 4] {
                    run_case($name, ranks);
                }
            }
        )*
        #[test]
        fn every_case_is_listed_here() {
            let listed = [$($name),*];
            for c in CASES {
                assert!(listed.contains(&c.name), "case {} is not run by this test file", c.name);
            }
        }
    };
}

cases! {
    collectives => "collectives",
    uneven_shards => "uneven-shards-crossing-ranges",
    batches_between_shards => "batches-back-and-forth-between-shards",
    batches_inside_one_shard => "batches-inside-one-shard",
    own_shard_in_place => "own-shard-in-place",
    positioned_batches_plain => "positioned-batches-of-many-ranges",
    positioned_batches_direct => "positioned-batches-on-a-direct-window",
    direct_window => "direct-window-accumulates-and-atomics",
    stepped_with_state => "direct-window-stepped-with-its-state",
    whole_in_place => "shared-window-read-whole-in-place",
    accumulate_f32 => "accumulate-everywhere-f32",
    accumulate_f64 => "accumulate-everywhere-f64",
    accumulate_u64 => "accumulate-everywhere-u64",
    fetch_add_tickets => "fetch-add-tickets",
    cas_election => "compare-and-swap-election",
    cas_spin_lock => "compare-and-swap-spin-lock",
    owner_waits => "owner-waits-on-its-own-shard",
    swap_chain => "swap-chain-and-load",
    load_batch => "load-batch-of-every-rank",
    bad_use => "bad-use-is-an-error",
}
