//! `problems DIR [tuning|judged|all]`: writes the generated learning problems
//! (`peregrine_tests::problems`) as LIBSVM/CSV text into DIR, for the defaults sweep and for
//! `scripts/sklearn_reference.py`.

use std::process::ExitCode;

use peregrine_tests::problems::{JUDGED, TUNING};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: problems DIR [tuning|judged|all]");
        return ExitCode::from(2);
    };
    let set: Vec<_> = match args.get(1).map_or("all", String::as_str) {
        "tuning" => TUNING.to_vec(),
        "judged" => JUDGED.to_vec(),
        "all" => TUNING.iter().chain(&JUDGED).copied().collect(),
        other => {
            eprintln!("error: unknown set `{other}` (tuning, judged or all)");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: creating {dir}: {e}");
        return ExitCode::FAILURE;
    }
    for p in set {
        match p.write(std::path::Path::new(dir)) {
            Ok((train, test)) => println!("{} {} {}", p.name, train.display(), test.display()),
            Err(e) => {
                eprintln!("error: writing {} into {dir}: {e}", p.name);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
