fn main() -> std::process::ExitCode {
    medea::cli::main()
}
