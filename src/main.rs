fn main() -> std::process::ExitCode {
    gpuprov::cli::main()
}
