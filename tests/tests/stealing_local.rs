//! Chunk queues on the local backend: ranks as threads, several threads per rank.

use peregrine_tests::stealing::exactly_once;
use peregrine_transport::run_local;

#[test]
fn every_chunk_is_handed_out_exactly_once() {
    for (ranks, threads) in [(1, 4), (2, 3), (4, 2)] {
        let reports = run_local(ranks, |t| exactly_once(&t, 30, threads)).expect("world");
        let mut stolen = 0;
        for r in reports {
            stolen += r.unwrap_or_else(|m| panic!("{ranks} ranks x {threads} threads: {m}")).stolen;
        }
        if ranks > 1 {
            assert!(stolen > 0, "{ranks} ranks: the slow rank 0 never had chunks taken over");
        }
    }
}
