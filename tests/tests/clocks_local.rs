//! The clocks' combining trees on the local backend: ranks as threads, several threads per rank
//! counting each other's chunks done.

use peregrine_tests::clocks::agree;
use peregrine_transport::run_local;

#[test]
fn the_trees_answer_as_every_ranks_words_do() {
    for (ranks, threads) in [(1, 2), (3, 2), (8, 3), (17, 1), (32, 2)] {
        let reports = run_local(ranks, |t| agree(&t, 25, threads)).expect("world");
        for (r, rep) in reports.into_iter().enumerate() {
            let rep = rep.unwrap_or_else(|m| panic!("{ranks} ranks x {threads} threads, rank {r}: {m}"));
            assert_eq!((rep.lined_up, rep.ticked, rep.summed), (25, 25, 25));
        }
    }
}
