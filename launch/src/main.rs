//! The `peregrine` binary (see the library's docs).

fn main() -> std::process::ExitCode {
    peregrine::main()
}
