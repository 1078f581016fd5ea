//! The `ember-agent` binary: everything is in the library (so that the fuzz targets reach its
//! parsers).
fn main() -> std::process::ExitCode {
    ember_agent::main()
}
