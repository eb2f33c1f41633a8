// mimalloc: a large plan or status is mostly small allocations (issue 20, BENCHMARKS.md
// figure 1); the library and its tests keep the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    gpuprov::cli::main()
}
