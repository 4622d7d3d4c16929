//! The `peregrine` binary (see the library's docs).

/// Large buffers on whole cache lines, for the kernels' 64-byte loads and stores.
#[global_allocator]
static ALLOC: peregrine_kernels::alloc::LineAligned = peregrine_kernels::alloc::LineAligned;

fn main() -> std::process::ExitCode {
    peregrine::main()
}
