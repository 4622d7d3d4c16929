#![no_main]
//! Slurm's syntax: hostlists (`node[01-04,07]`), task counts (`2(x3),1`) and the job's
//! environment (`KEY=VALUE` lines).

use libfuzzer_sys::fuzz_target;
use peregrine_slurm::{compress, expand, format_tasks_per_node, parse_tasks_per_node, SlurmEnv};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // A list may expand to a million hosts (MAX_HOSTS, 64 MiB): a short input can take a second
    // natively and ten under the sanitizer; the round trip is checked on lists of a usual size.
    if let Some(hosts) = expand(text).ok().filter(|h| h.len() <= 10_000) {
        // What compress writes, expand reads back.
        let again = expand(&compress(&hosts)).expect("a compressed list expands");
        assert_eq!(again, hosts);
    }
    if let Ok(counts) = parse_tasks_per_node(text) {
        assert_eq!(
            parse_tasks_per_node(&format_tasks_per_node(&counts)).expect("formatted counts parse"),
            counts
        );
    }
    let vars: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let env = SlurmEnv::from_vars(|k| vars.iter().rev().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned()));
    if let Ok(Some(env)) = env {
        let _ = env.summary();
        let _ = env.node_name();
        let _ = env.tasks_on_node();
    }
});
